"""/api/v1/evaluations/ on the real stack: a key evaluates only its owner's sessions (another
owner's is a 404, as a missing one), bad filters and candidates are 400s in the error shape,
and the report reads as the contract says once the evaluation ran."""

from typing import Any

import pytest

from evaluations import services
from evaluations.models import Evaluation
from record.models import Session
from tests.factories import api_key_for
from tests.fakes.model_servers import FakeModelServer, Reply
from tests.sessions.api.conftest import Api, assert_error

from .conftest import recorded_script

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/evaluations/"


@pytest.fixture
def owner_api(recorded: Session) -> Api:
    return Api(api_key_for(recorded.owner.username))


def test_an_owner_evaluates_its_session_and_reads_the_report(
    recorded: Session, owner_api: Api, openai_server: FakeModelServer
) -> None:
    created = owner_api.post(
        URL, {"sessions": [str(recorded.pk)], "candidate": {"model": recorded.agent.model.name}}
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["state"] == "queued" and body["progress"] == {"done": 0, "total": 2}
    openai_server.script(Reply(text="Hello! How can I help?"), *recorded_script())
    services.evaluation_run(evaluation_id=body["id"])  # what the worker's task does

    report = owner_api.get(f"{URL}{body['id']}/").json()
    assert report["state"] == "finished"
    assert report["progress"] == {"done": 2, "total": 2}
    assert {
        k: report["totals"][k]
        for k in ("turns", "trajectory_match", "outcome_match", "answer_similarity", "cost_ratio")
    } == {
        "turns": 2,
        "trajectory_match": 1.0,
        "outcome_match": 1.0,
        "answer_similarity": 1.0,
        "cost_ratio": 1.0,
    }
    refund = next(t for t in report["turns"] if t["turn"] == 2)
    assert refund["session"] == str(recorded.pk) and refund["trajectory_match"] is True
    assert (
        refund["baseline"]["calls"]
        == refund["candidate"]["calls"]
        == [
            {"tool": "get_order", "arguments": {"number": "SO-1001"}},
            {"tool": "issue_coupon", "arguments": {"customer_id": 7, "amount": 10}},
        ]
    )
    assert refund["candidate"]["would_have_called"] == []
    listed = owner_api.get(URL).json()
    assert [e["id"] for e in listed] == [body["id"]]


def test_a_filter_picks_the_owners_sessions(recorded: Session, owner_api: Api) -> None:
    created = owner_api.post(
        URL,
        {
            "filter": {"agent": recorded.agent.slug, "search": "SO-1001", "outcome": "ok"},
            "candidate": {"system_prompt": "Be brief."},
        },
    )
    assert created.status_code == 201, created.content
    assert list(Evaluation.objects.get(pk=created.json()["id"]).sessions.all()) == [recorded]
    nothing = owner_api.post(
        URL,
        {"filter": {"search": "no conversation says this"}, "candidate": {"system_prompt": "x"}},
    )
    assert_error(nothing, 400, "no_sessions")


def test_another_owners_session_and_evaluation_are_not_found(
    recorded: Session, owner_api: Api
) -> None:
    stranger = Api(api_key_for("stranger"))
    refused = stranger.post(
        URL, {"sessions": [str(recorded.pk)], "candidate": {"system_prompt": "x"}}
    )
    assert_error(refused, 404, "session_not_found")
    # By filter, another owner's sessions are simply not there.
    assert_error(
        stranger.post(
            URL, {"filter": {"agent": recorded.agent.slug}, "candidate": {"system_prompt": "x"}}
        ),
        400,
        "no_sessions",
    )
    mine = owner_api.post(
        URL, {"sessions": [str(recorded.pk)], "candidate": {"system_prompt": "x"}}
    )
    evaluation_id = mine.json()["id"]
    assert_error(stranger.get(f"{URL}{evaluation_id}/"), 404, "evaluation_not_found")
    assert_error(stranger.post(f"{URL}{evaluation_id}/cancel/"), 404, "evaluation_not_found")
    assert_error(owner_api.get(f"{URL}not-a-number/"), 404, "evaluation_not_found")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"candidate": {"system_prompt": "x"}}, "invalid_input"),  # neither sessions nor filter
        ({"sessions": [], "candidate": {"system_prompt": "x"}}, "invalid_input"),
        ({"filter": {"since": "yesterday"}, "candidate": {"system_prompt": "x"}}, "invalid_input"),
        (
            {
                "filter": {"since": "2026-05-02", "until": "2026-05-01"},
                "candidate": {"system_prompt": "x"},
            },
            "invalid_input",
        ),
        ({"filter": {"outcome": "great"}, "candidate": {"system_prompt": "x"}}, "invalid_input"),
        ({"filter": {"agent": "../../etc"}, "candidate": {"system_prompt": "x"}}, "invalid_input"),
        ({"filter": "all", "candidate": {"system_prompt": "x"}}, "invalid_input"),
        ({"filter": {}, "candidate": {"model": "nope"}}, "unknown_model"),
        ({"filter": {}, "candidate": {"agent_version": 2}}, "invalid_input"),
        ({"filter": {}, "candidate": {"workflow_version": 2}}, "invalid_input"),
        ({"filter": {}, "candidate": {"workflow_version": "nope@1"}}, "unknown_workflow_version"),
        ({"filter": {}, "candidate": ["model"]}, "invalid_input"),
        (
            {"filter": {}, "candidate": {"system_prompt": "x"}, "judge": {"model": 1}},
            "invalid_input",
        ),
        ({"filter": {}, "candidate": {"system_prompt": "x"}, "budget": "-1"}, "invalid_input"),
        (
            {"filter": {}, "candidate": {"system_prompt": "x"}, "allow_read_only_calls": "maybe"},
            "invalid_input",
        ),
        ({"sessions": ["' OR 1=1 --"], "candidate": {"system_prompt": "x"}}, "session_not_found"),
    ],
)
def test_bad_input_is_a_400_or_404_in_the_error_shape(
    recorded: Session, owner_api: Api, body: dict[str, Any], code: str
) -> None:
    status = 404 if code == "session_not_found" else 400
    assert_error(owner_api.post(URL, body), status, code)
    assert not Evaluation.objects.exists()


def test_a_cancel_of_an_ended_evaluation_is_a_409(recorded: Session, owner_api: Api) -> None:
    evaluation_id = owner_api.post(
        URL, {"sessions": [str(recorded.pk)], "candidate": {"system_prompt": "x"}}
    ).json()["id"]
    assert owner_api.post(f"{URL}{evaluation_id}/cancel/").json()["state"] == "cancelled"
    assert_error(owner_api.post(f"{URL}{evaluation_id}/cancel/"), 409, "illegal_transition")


def test_a_saved_set_is_an_earlier_evaluations_sessions_and_only_its_owners(
    recorded: Session, owner_api: Api
) -> None:
    first = owner_api.post(
        URL, {"sessions": [str(recorded.pk)], "candidate": {"system_prompt": "x"}}
    ).json()["id"]
    again = owner_api.post(URL, {"same_sessions_as": first, "candidate": {"system_prompt": "y"}})
    assert again.status_code == 201, again.content
    assert list(Evaluation.objects.get(pk=again.json()["id"]).sessions.all()) == [recorded]
    stranger = Api(api_key_for("stranger"))
    assert_error(
        stranger.post(URL, {"same_sessions_as": first, "candidate": {"system_prompt": "x"}}),
        404,
        "evaluation_not_found",
    )
    assert_error(
        owner_api.post(
            URL,
            {"same_sessions_as": first, "filter": {}, "candidate": {"system_prompt": "x"}},
        ),
        400,
        "invalid_input",
    )
