from django.urls import path

from .api import (
    ApprovalApproveView,
    ApprovalChangeView,
    ApprovalListView,
    ApprovalRejectView,
    ApprovalReviewView,
    ApprovalWithdrawView,
)

urlpatterns = [
    path("", ApprovalListView.as_view(), name="approval-list"),
    path("<uuid:approval_id>/approve/", ApprovalApproveView.as_view(), name="approval-approve"),
    path("<uuid:approval_id>/reject/", ApprovalRejectView.as_view(), name="approval-reject"),
    path("<uuid:approval_id>/review/", ApprovalReviewView.as_view(), name="approval-review"),
    path("<uuid:approval_id>/withdraw/", ApprovalWithdrawView.as_view(), name="approval-withdraw"),
    path("<uuid:approval_id>/change/", ApprovalChangeView.as_view(), name="approval-change"),
]
