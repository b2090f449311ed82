"""What every REST edge shares: the error shape and the exception handler that writes it,
the JSON errors of Django's own 404/500 and the query-string guard, the bounded JSON
parser, and the OpenAPI rules that document each operation's errors.

An edge package (sessions.api, approvals.api, openai_compat.api, ...) may import this;
nothing below the edges does.
"""
