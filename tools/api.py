"""Read-only REST listing of the tools a caller's roles may use."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from . import api_docs
from .models import Tool
from .selectors import tools_for_roles


class ToolSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tool
        fields = [
            "name",
            "description",
            "parameters",
            "result_description",
            "kind",
            "timeout_s",
            "side_effects",
            "requires_approval",
            "risk_level",
            "roles",
            "credit_cost",
        ]
        read_only_fields = fields


class ToolListView(APIView):
    @api_docs.tool_list
    @extend_schema(responses=ToolSerializer(many=True))
    def get(self, request: Request) -> Response:
        roles = list(getattr(request.auth, "roles", None) or [])
        return Response(ToolSerializer(tools_for_roles(roles=roles), many=True).data)
