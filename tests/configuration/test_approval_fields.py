"""apply_config and the admin check a tool's approval fields; create_api_key --approver."""

import io

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from accounts.models import Approver
from configuration.services import ConfigInvalid, config_apply
from tools.models import Tool

pytestmark = pytest.mark.django_db


def _document(**tool_fields):  # type: ignore[no-untyped-def]
    return {
        "tools": [
            {
                "name": "refund",
                "description": "Refund an order.",
                "kind": "python",
                "handler": "builtin.current_time",
                "parameters": {"type": "object", "properties": {}},
                **tool_fields,
            }
        ]
    }


def test_approval_fields_apply():
    condition = {
        "any": [{"field": "amount", "op": "gt", "value": 50}, {"field": "vip", "op": "exists"}]
    }
    config_apply(
        document=_document(
            approval_when=condition,
            approval_timeout_s=60,
            approval_on_timeout="escalate",
            approval_escalate_to="managers",
        )
    )
    tool = Tool.objects.get(name="refund")
    assert tool.approval_when == condition
    assert (tool.approval_timeout_s, tool.approval_on_timeout, tool.approval_escalate_to) == (
        60,
        "escalate",
        "managers",
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"approval_when": {"any": [{"field": "amount", "op": "between", "value": 1}]}},
            "tools[0] (refund).approval_when.any[0].op: must be one of",
        ),
        (
            {"approval_when": {"field": "amount", "op": "gt"}},
            "approval_when.value: gt needs a value",
        ),
        ({"approval_on_timeout": "escalate"}, "tools[0] (refund).approval_escalate_to: required"),
        ({"approval_on_timeout": "ignore"}, "approval_on_timeout"),
        ({"risk_level": 4}, "risk_level"),
    ],
)
def test_a_wrong_approval_field_changes_nothing_and_says_where(fields, message):
    with pytest.raises(ConfigInvalid) as error:
        config_apply(document=_document(**fields))
    assert message in str(error.value), str(error.value)
    assert not Tool.objects.exists()


def test_tool_clean_checks_the_condition():
    tool = Tool(
        name="t",
        description="d",
        handler="builtin.current_time",
        parameters={"type": "object"},
        approval_when={"field": "x", "op": "nope", "value": 1},
    )
    with pytest.raises(ValidationError) as error:
        tool.clean()
    assert "approval_when" in error.value.message_dict


def test_create_api_key_with_approver_rights():
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "create_api_key",
        "--user",
        "alice",
        "--roles",
        "support",
        "--approver",
        stdout=out,
        stderr=err,
    )
    assert out.getvalue().startswith("ap_") and "(approver)" in err.getvalue()
    assert Approver.objects.get(user__username="alice").groups == ["approvers"]
    call_command(
        "create_api_key",
        "--user",
        "alice",
        "--approver",
        "--approver-groups",
        "managers",
        stdout=out,
        stderr=err,
    )
    assert Approver.objects.get(user__username="alice").groups == ["approvers", "managers"]
    call_command("create_api_key", "--user", "bob", stdout=out, stderr=err)
    assert not Approver.objects.filter(user__username="bob").exists()
