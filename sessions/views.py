from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .models import Agent


def playground(request: HttpRequest) -> HttpResponse:
    """A browser page to pick an agent, chat and watch the events live."""
    agents = list(Agent.objects.filter(enabled=True).values_list("slug", flat=True))
    return render(request, "playground/index.html", {"agents": agents})
