from django.urls import path

from .api import ApprovalApproveView, ApprovalListView, ApprovalRejectView, ApprovalReviewView

urlpatterns = [
    path("", ApprovalListView.as_view(), name="approval-list"),
    path("<uuid:approval_id>/approve/", ApprovalApproveView.as_view(), name="approval-approve"),
    path("<uuid:approval_id>/reject/", ApprovalRejectView.as_view(), name="approval-reject"),
    path("<uuid:approval_id>/review/", ApprovalReviewView.as_view(), name="approval-review"),
]
