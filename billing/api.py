"""`GET /api/v1/usage/`: the caller's credits and usage."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from . import api_docs
from .selectors import usage_for_owner


class CreditsSerializer(serializers.Serializer):
    balance = serializers.IntegerField()
    reserved = serializers.IntegerField()
    daily_cap = serializers.IntegerField(allow_null=True)
    spent_today = serializers.IntegerField()


class TokensSerializer(serializers.Serializer):
    input = serializers.IntegerField()
    output = serializers.IntegerField()


class OwnerUsageSerializer(serializers.Serializer):
    credits = CreditsSerializer()
    tokens = TokensSerializer()
    cost = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=True)


class UsageView(APIView):
    @api_docs.usage_retrieve
    @extend_schema(responses=OwnerUsageSerializer)
    def get(self, request: Request) -> Response:
        usage = usage_for_owner(owner_id=request.user.pk)
        payload = {
            "credits": {
                "balance": usage.balance,
                "reserved": usage.reserved,
                "daily_cap": usage.daily_cap,
                "spent_today": usage.spent_today,
            },
            "tokens": {"input": usage.input_tokens, "output": usage.output_tokens},
            "cost": usage.cost,
        }
        return Response(OwnerUsageSerializer(payload).data)
