from django.urls import path

from . import views

urlpatterns = [
    path("agents/", views.AgentListView.as_view(), name="agent-list"),
    path("sessions/", views.SessionListView.as_view(), name="session-list"),
    path("sessions/<uuid:session_id>/", views.SessionDetailView.as_view(), name="session-detail"),
    path(
        "sessions/<uuid:session_id>/messages/",
        views.SessionMessagesView.as_view(),
        name="session-messages",
    ),
    path(
        "sessions/<uuid:session_id>/events/",
        views.SessionEventsView.as_view(),
        name="session-events",
    ),
    path(
        "sessions/<uuid:session_id>/cancel/",
        views.SessionCancelView.as_view(),
        name="session-cancel",
    ),
    path("sessions/<uuid:session_id>/fork/", views.SessionForkView.as_view(), name="session-fork"),
    path(
        "sessions/<uuid:session_id>/resume/",
        views.SessionResumeView.as_view(),
        name="session-resume",
    ),
    path(
        "sessions/<uuid:session_id>/graph/", views.SessionGraphView.as_view(), name="session-graph"
    ),
    path(
        "sessions/<uuid:session_id>/checkpoints/",
        views.SessionCheckpointsView.as_view(),
        name="session-checkpoints",
    ),
]
