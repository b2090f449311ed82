"""Roles: created with keys or by apply_config, named by tools, and which tools each reaches."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.urls import reverse

from accounts.models import Role
from accounts.services import api_key_create, unknown_roles
from tests.factories import ToolFactory

pytestmark = pytest.mark.django_db


def test_issuing_a_key_creates_its_roles_once():
    api_key_create(username="alice", roles=["support", " analyst "])
    api_key_create(username="bob", roles=["support"])
    assert list(Role.objects.values_list("name", flat=True)) == ["analyst", "support"]


def test_unknown_roles_lists_the_ones_not_yet_declared_in_order():
    Role.objects.create(name="support")
    assert unknown_roles(["suport", "support", "analyst"]) == ["suport", "analyst"]
    assert unknown_roles([]) == []


def test_the_command_says_out_loud_when_it_creates_a_role():
    Role.objects.create(name="support")
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "create_api_key", "--user", "x", "--roles", "support,suport", stdout=out, stderr=err
    )
    assert "note: created new role(s): suport" in err.getvalue()
    assert out.getvalue().strip().startswith("ap_")

    err = io.StringIO()
    call_command(
        "create_api_key", "--user", "x", "--roles", "support", stdout=io.StringIO(), stderr=err
    )
    assert "created new role" not in err.getvalue()


def test_role_names_are_unique():
    Role.objects.create(name="support")
    with pytest.raises(IntegrityError), transaction.atomic():
        Role.objects.create(name="support")


def test_the_role_admin_shows_which_tools_each_role_reaches(client):
    user = get_user_model().objects.create_superuser(
        "operator", "operator@example.com", "pw-not-used"
    )
    client.force_login(user)
    Role.objects.create(name="support")
    Role.objects.create(name="analyst")
    ToolFactory(name="open_to_all", roles=[])
    ToolFactory(name="issue_coupon", roles=["support"])
    ToolFactory(name="get_order", roles=["support", "analyst"])
    ToolFactory(name="switched_off", roles=["support"], enabled=False)

    page = client.get(reverse("admin:accounts_role_changelist"))

    assert page.status_code == 200
    rows = {
        role.name: page.context["cl"].model_admin.tools_reached(role)
        for role in page.context["cl"].result_list
    }
    assert rows == {
        "analyst": "get_order, open_to_all",
        "support": "get_order, issue_coupon, open_to_all",
    }
