"""Schema-driven fuzzing: every REST operation, against the live daphne, answers as its OpenAPI says.

schemathesis generates valid and invalid requests for each operation from
the served schema and checks that none is a 5xx, that every status code is
documented and that every body matches its documented schema (the error
responses included). It is seeded and bounded so it runs the same way every
time and in well under a minute.
"""

import itertools
import json
import uuid
from typing import Any

import httpx
import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.support import api, create_session, post_message, turns_finished, wait_events
from tests.factories import AgentFactory, api_key_for
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
MAX_EXAMPLES = 12
SEED = 20240801
KEY_PLACEHOLDER = "placeholder-for-the-test-key"


class Target:
    """Where the cases go: the live stack, a key, a real agent and session to aim at.

    Random ids and slugs almost never name anything, so most cases would stop
    at 404 or "unknown agent"; part of them are pointed at real ones. The
    choice goes by the case's number, so a seeded run repeats itself.
    """

    def __init__(self, stack: Stack, key: str, agent: str, session_id: str) -> None:
        self.stack = stack
        self.key = key
        self.agent = agent
        self.session_id = session_id
        self._cases = itertools.count()

    def aim(self, case: schemathesis.Case) -> None:
        """Send the real key where the case carries the configured one, and aim at the real session."""
        headers = case.headers or {}
        if headers.get("Authorization") == f"Bearer {KEY_PLACEHOLDER}":
            headers["Authorization"] = f"Bearer {self.key}"
        turn = next(self._cases)
        params = case.path_parameters or {}
        # Ids that are not UUIDs (negative cases) stay as they are.
        if _is_uuid(params.get("session_id")) and turn % 4:
            params["session_id"] = self.session_id
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("agent"), str) and turn % 2:
            body["agent"] = self.agent


def _is_uuid(value: Any) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


@pytest.fixture
def target(live_stack: Stack) -> Target:
    AgentFactory(slug="echo", rules=[{"answer": "Echo: {{ user }}"}])
    key = api_key_for("fuzzer")
    with api(live_stack, key) as client:
        session_id = create_session(client, "echo")
        post_message(client, session_id, "hello")
        # Checkpoints and events exist once the first turn has finished.
        wait_events(client, session_id, turns_finished(1), timeout=30)
    return Target(live_stack, key, "echo", session_id)


def _schema() -> Any:
    """The schema the server serves, generated in-process so cases exist at collection time.

    The live stack needs the test database, which exists only once tests run;
    `test_the_fuzzed_schema_is_the_served_one` checks the two are the same.
    """
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {"deterministic": True, "database": "none"},
            # Sequences of calls are not what this test is about, and cost time.
            "phases": {"stateful": {"enabled": False}},
            # Cases are generated before the test's key exists; `Target.aim` swaps it in.
            "auth": {"openapi": {"ApiKey": {"bearer": KEY_PLACEHOLDER}}},
        }
    )
    return schemathesis.openapi.from_dict(_generated_schema(), config=config)


def _generated_schema() -> dict[str, Any]:
    return json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True)))


schema = _schema()


def test_the_fuzzed_schema_is_the_served_one(live_stack: Stack) -> None:
    served = httpx.get(f"{live_stack.http}/api/v1/schema/?format=json", timeout=15)
    assert served.status_code == 200
    assert served.json() == _generated_schema()


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_conforms_to_its_schema(case: schemathesis.Case, target: Target) -> None:
    target.aim(case)
    case.call_and_validate(base_url=target.stack.http, checks=CHECKS, timeout=15)
