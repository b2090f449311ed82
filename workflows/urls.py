from django.urls import path

from .api import WorkflowListView, WorkflowRunsView

urlpatterns = [
    path("", WorkflowListView.as_view(), name="workflow-list"),
    path("<slug:slug>/runs/", WorkflowRunsView.as_view(), name="workflow-runs"),
]
