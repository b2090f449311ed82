from django.urls import path

from . import views

urlpatterns = [
    path("sessions/", views.SessionListView.as_view(), name="session-list"),
    path("sessions/<uuid:session_id>/", views.SessionDetailView.as_view(), name="session-detail"),
    path("sessions/<uuid:session_id>/messages/", views.SessionMessagesView.as_view(), name="session-messages"),
    path("sessions/<uuid:session_id>/events/", views.SessionEventsView.as_view(), name="session-events"),
    path("sessions/<uuid:session_id>/cancel/", views.SessionCancelView.as_view(), name="session-cancel"),
]
