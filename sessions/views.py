from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from .models import Agent


@require_safe
def playground(request: HttpRequest) -> HttpResponse:
    """A browser page to pick an agent, chat and watch the events live.

    No login: the page only holds the API key the person pastes, and every
    call it makes is authorised by that key.
    """
    agents = list(Agent.objects.filter(enabled=True).order_by("slug").values("slug", "name"))
    return render(request, "playground/index.html", {"agents": agents})
