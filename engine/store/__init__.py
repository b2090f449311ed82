"""The store: the step commit (one short transaction per step) and the read that rides on it.
It imports only the record (sessions' models, states, events, rows, publisher)."""
