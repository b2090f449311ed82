"""bootstrap_demo --credentials-file: new secrets go to a private file, not to the terminal."""

import io
import stat

import pytest
from django.core.management import call_command

from devstack.paths import read_env_file

pytestmark = pytest.mark.django_db


def test_new_credentials_are_written_mode_600_and_not_printed(tmp_path):
    target = tmp_path / "credentials"
    out = io.StringIO()
    call_command("bootstrap_demo", credentials_file=str(target), stdout=out)

    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    values = read_env_file(target)
    assert values["OPERATOR_USERNAME"] == "operator"
    assert values["OPERATOR_PASSWORD"] and values["DEMO_API_KEY"].startswith("ap_")
    assert values["OPERATOR_PASSWORD"] not in out.getvalue()
    assert values["DEMO_API_KEY"] not in out.getvalue()
    assert str(target) in out.getvalue()

    # A second run creates nothing, so the file keeps the first secrets.
    call_command("bootstrap_demo", credentials_file=str(target), stdout=io.StringIO())
    assert read_env_file(target) == values


def test_without_a_file_the_secrets_are_printed_once():
    first, second = io.StringIO(), io.StringIO()
    call_command("bootstrap_demo", stdout=first)
    call_command("bootstrap_demo", stdout=second)
    assert "password '" in first.getvalue() and "shown once" in first.getvalue()
    assert "password '" not in second.getvalue()


def test_migrate_and_config_in_the_same_start_with_no_description_warnings(tmp_path):
    from record.models import Agent
    from tests.stack import ROOT

    out, err = io.StringIO(), io.StringIO()
    call_command(
        "bootstrap_demo",
        migrate=True,
        config=str(ROOT / "config" / "demo.yaml"),
        no_url_check=True,
        credentials_file=str(tmp_path / "credentials"),
        verbosity=0,
        stdout=out,
        stderr=err,
    )
    assert "agent order-support: created" in out.getvalue(), out.getvalue()
    # The demo's own tools say when to use them, when not, each parameter and the result.
    assert "warning" not in (out.getvalue() + err.getvalue()).lower(), out.getvalue()
    assert Agent.objects.filter(slug="order-support").exists()
    assert read_env_file(tmp_path / "credentials")["DEMO_API_KEY"].startswith("ap_")


def test_the_demo_refund_review_waits_a_day_for_a_newcomer(tmp_path):
    # Ten minutes expired it before a newcomer found the approvals queue: the run told
    # the customer "declined after review" with nobody having looked.
    from tests.demo_setup import demo_install
    from workflows.models import Workflow

    demo_install()
    definition = Workflow.objects.get(slug="refund").versions.latest("number").definition
    review = definition["nodes"]["review"]
    assert review["timeout_s"] >= 24 * 3600 and review["on_timeout"] == "reject"
