from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from sessions.status import vocabulary


@require_safe
def playground(request: HttpRequest) -> HttpResponse:
    """A browser page to pick an agent, chat and watch the events live.

    No login and no data in the page itself: it only holds the API key the
    person pastes, and everything it shows (the agents included) comes from
    calls authorised by that key, sent in a header, never in a URL.
    """
    return render(request, "playground/index.html", {"status_vocabulary": vocabulary()})
