from django.urls import path

from .api import EvaluationCancelView, EvaluationDetailView, EvaluationListView

urlpatterns = [
    path("", EvaluationListView.as_view(), name="evaluation-list"),
    path("<str:evaluation_id>/", EvaluationDetailView.as_view(), name="evaluation-detail"),
    path("<str:evaluation_id>/cancel/", EvaluationCancelView.as_view(), name="evaluation-cancel"),
]
