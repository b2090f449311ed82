"""The operators' console: agents, models, sessions and their read-only history.

Operators read what the engine wrote; they never edit it. A session's state
only moves through the state machine, so the one thing an operator can do to
a run here is ask the service layer to cancel its turn.

One module per page family; importing them registers their pages.
"""

from django.contrib import admin

from . import agents, endpoints, home, records, sessions, workers

admin.site.site_header = "Agent platform"
admin.site.site_title = "Agent platform"
admin.site.index_title = "Operations"
# The app list beside every page would leave the operator's tables a third of a
# 1400 px screen; the breadcrumbs and the index page lead everywhere.
admin.site.enable_nav_sidebar = False

__all__ = ["agents", "endpoints", "home", "records", "sessions", "workers"]
