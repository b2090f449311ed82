"""Every endpoint of the public REST contract, on its happy path."""

import uuid

import pytest

from engine import session_run
from hooks.models import RunWebhook
from record.models import Event, Session

from .conftest import assert_error

pytestmark = pytest.mark.django_db

BASE = "/api/v1/sessions/"


def test_create_a_session(api):
    response = api.post(BASE, {"agent": "helper", "metadata": {"ticket": "T-1"}})

    assert response.status_code == 201
    body = response.json()
    uuid.UUID(body["id"])
    assert body["agent"] == "helper"
    assert body["role"] == "support"  # the key's first role
    assert body["metadata"] == {"ticket": "T-1"}
    assert (body["state"], body["version"], body["turn"], body["queued_count"]) == ("idle", 0, 0, 0)
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0, "cost": "0.000000"}
    assert body["created_at"] and body["updated_at"]
    session = Session.objects.get(pk=body["id"])
    assert session.owner.username == "alice"
    # The key that opened it is charged with its model calls (billing.SpendDaily).
    assert session.api_key_id == session.owner.api_keys.get().pk


def test_create_a_session_with_a_granted_role(api):
    response = api.post(BASE, {"agent": "helper", "role": "analyst"})
    assert response.status_code == 201 and response.json()["role"] == "analyst"


def test_create_a_session_with_a_role_the_key_lacks_is_400(api):
    error = assert_error(api.post(BASE, {"agent": "helper", "role": "admin"}), 400, "invalid_input")
    assert error["details"] == {"field": "role"}
    assert not Session.objects.exists()


def test_list_my_sessions_newest_first(api, other_api):
    first = api.post(BASE, {"agent": "helper"}).json()["id"]
    second = api.post(BASE, {"agent": "helper"}).json()["id"]
    other_api.post(BASE, {"agent": "helper"})
    assert [s["id"] for s in api.get(BASE).json()] == [second, first]
    assert [s["id"] for s in api.get(BASE, {"limit": 1}).json()] == [second]


def test_get_a_session(api, session_id):
    response = api.get(f"{BASE}{session_id}/")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == session_id
    assert {"state", "version", "usage", "created_at", "updated_at", "turn", "last_error"} <= set(
        body
    )


@pytest.mark.django_db(transaction=True)
def test_a_session_shows_how_its_last_turn_went(api, session_id):
    assert api.get(f"{BASE}{session_id}/").json()["last_turn"] is None
    api.post(f"{BASE}{session_id}/messages/", {"content": "hello"})
    assert session_run(session_id=session_id).stopped == "idle"

    body = api.get(f"{BASE}{session_id}/").json()
    assert body["last_turn"] == {
        "turn": 1,
        "outcome": "ok",
        "calls": {"ok": 0, "failed": 0, "rejected": 0, "expired": 0, "unpaid": 0},
    }
    # What the row says is what the turn's turn.finished said.
    finished = Event.objects.get(session_id=session_id, type="turn.finished").data
    assert (finished["outcome"], finished["calls"]) == ("ok", body["last_turn"]["calls"])
    # A turn that ended otherwise shows so (the list and the detail read the same columns).
    Session.objects.filter(pk=session_id).update(
        last_turn_number=2, last_turn_outcome="tool_failures", last_turn_calls={"rejected": 3}
    )
    listed = next(s for s in api.get(BASE).json() if s["id"] == session_id)
    assert listed["last_turn"] == {
        "turn": 2,
        "outcome": "tool_failures",
        "calls": {"ok": 0, "failed": 0, "rejected": 3, "expired": 0, "unpaid": 0},
    }


def test_post_a_message_is_202_and_starts_the_turn(api, session_id):
    response = api.post(
        f"{BASE}{session_id}/messages/", {"content": "hello", "idempotency_key": "k-1"}
    )

    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["role"], body["content"], body["seq"], body["turn"], body["status"]) == (
        "user",
        "hello",
        1,
        1,
        "final",
    )
    assert body["idempotency_key"] == "k-1"
    detail = api.get(f"{BASE}{session_id}/").json()
    assert (detail["state"], detail["turn"], detail["version"]) == ("processing", 1, 1)


def test_an_idempotent_repeat_is_200_with_the_same_message(api, session_id):
    url = f"{BASE}{session_id}/messages/"
    first = api.post(url, {"content": "hello", "idempotency_key": "k-1"})
    again = api.post(url, {"content": "hello", "idempotency_key": "k-1"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len(api.get(url).json()) == 1


def test_the_same_key_with_other_content_is_409(api, session_id):
    url = f"{BASE}{session_id}/messages/"
    api.post(url, {"content": "hello", "idempotency_key": "k-1"})
    assert_error(
        api.post(url, {"content": "bye", "idempotency_key": "k-1"}), 409, "idempotency_key_reused"
    )


def test_an_idempotency_key_header_is_the_body_field_per_owner(api, other_api, session_id):
    url = f"{BASE}{session_id}/messages/"
    first = api.post(url, {"content": "hello"}, HTTP_IDEMPOTENCY_KEY="h-1")
    again = api.post(url, {"content": "hello"}, HTTP_IDEMPOTENCY_KEY="h-1")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == first.json()  # the first response, as it was
    assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert first.json()["idempotency_key"] == "h-1"
    # The body field is the same key.
    by_body = api.post(url, {"content": "hello", "idempotency_key": "h-1"})
    assert by_body.status_code == 200 and by_body.json()["id"] == first.json()["id"]
    assert len(api.get(url).json()) == 1
    # Another body, or another session (another request), with the key: 409, final.
    for other_url, body in ((url, {"content": "bye"}), (None, {"content": "hello"})):
        if other_url is None:
            other_url = f"{BASE}{api.post(BASE, {'agent': 'helper'}).json()['id']}/messages/"
        reused = api.post(other_url, body, HTTP_IDEMPOTENCY_KEY="h-1")
        assert_error(reused, 409, "idempotency_key_reused")
        assert reused["x-should-retry"] == "false"
    assert len(api.get(url).json()) == 1
    # A key is its owner's: another owner's "h-1" is theirs alone.
    theirs = other_api.post(BASE, {"agent": "helper"}).json()["id"]
    assert (
        other_api.post(
            f"{BASE}{theirs}/messages/", {"content": "hello"}, HTTP_IDEMPOTENCY_KEY="h-1"
        ).status_code
        == 202
    )


def test_a_header_and_a_body_key_that_differ_or_a_bad_key_are_400(api, session_id):
    url = f"{BASE}{session_id}/messages/"
    differ = api.post(url, {"content": "hi", "idempotency_key": "a"}, HTTP_IDEMPOTENCY_KEY="b")
    assert_error(differ, 400, "invalid_idempotency_key")
    assert differ["x-should-retry"] == "false"
    for bad in ("with space", "x" * 201):
        assert_error(
            api.post(url, {"content": "hi"}, HTTP_IDEMPOTENCY_KEY=bad),
            400,
            "invalid_idempotency_key",
        )
    assert api.get(url).json() == []


def test_a_final_refusal_says_x_should_retry_false(api):
    missing = api.post(f"{BASE}{uuid.uuid4()}/messages/", {"content": "hi"})
    assert_error(missing, 404)
    assert missing["x-should-retry"] == "false"


def test_a_second_message_while_processing_is_queued(api, session_id):
    url = f"{BASE}{session_id}/messages/"
    api.post(url, {"content": "one"})
    response = api.post(url, {"content": "two"})
    assert response.status_code == 202
    assert (response.json()["seq"], response.json()["status"]) == (None, "queued")
    assert api.get(f"{BASE}{session_id}/").json()["queued_count"] == 1
    assert [m["content"] for m in api.get(url).json()] == ["one", "two"]


def test_message_history_is_oldest_first_and_limited(api, session_id):
    url = f"{BASE}{session_id}/messages/"
    for text in ("one", "two", "three", "four"):
        api.post(url, {"content": text})
    assert [m["content"] for m in api.get(url).json()] == ["one", "two", "three", "four"]
    assert [m["content"] for m in api.get(url, {"limit": 2}).json()] == ["three", "four"]
    assert [m["content"] for m in api.get(url, {"limit": 1}).json()] == ["four"]


def test_events_after_a_sequence_number(api, session_id):
    api.post(f"{BASE}{session_id}/messages/", {"content": "hello"})
    url = f"{BASE}{session_id}/events/"

    events = api.get(url, {"after": 0}).json()
    assert [(e["seq"], e["type"]) for e in events] == [
        (1, "state.changed"),
        (2, "message.completed"),
    ]
    assert set(events[1]) == {"seq", "type", "session", "ts", "data"}
    assert events[1]["session"] == session_id
    assert events[1]["data"]["content"] == "hello"
    assert events[0]["data"] == {
        "from": "idle",
        "to": "processing",
        "trigger": "user_message",
        "reason": "turn 1",
    }

    assert [e["seq"] for e in api.get(url, {"after": 1}).json()] == [2]
    assert api.get(url, {"after": 2}).json() == []
    assert [e["seq"] for e in api.get(url).json()] == [1, 2]  # after defaults to 0
    assert [e["seq"] for e in api.get(url, {"limit": 1}).json()] == [1]


def test_cancel_a_running_turn(api, session_id):
    api.post(f"{BASE}{session_id}/messages/", {"content": "hello"})
    response = api.post(f"{BASE}{session_id}/cancel/")
    assert response.status_code == 200
    body = response.json()
    assert body["cancelled"] is True
    assert body["session"]["id"] == session_id
    assert Session.objects.get(pk=session_id).cancel_requested is True


def test_cancel_with_nothing_running(api, session_id):
    response = api.post(f"{BASE}{session_id}/cancel/")
    assert response.status_code == 200
    assert response.json()["cancelled"] is False
    assert response.json()["session"]["state"] == "idle"


def test_cancel_while_awaiting_approval_cancels_at_once(api, session_id):
    Session.objects.filter(pk=session_id).update(state="awaiting_approval")
    body = api.post(f"{BASE}{session_id}/cancel/").json()
    assert body["cancelled"] is True
    assert body["session"]["state"] == "cancelled"


def test_health_probe(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_events_are_paged_by_size_as_well_as_count(api, session_id, settings):
    settings.EVENTS_PAGE_MAX_BYTES = 1024 * 1024
    session = Session.objects.get(pk=session_id)
    # Four events of ~400 KB, then a small one: two large ones fit a page of 1 MiB.
    for seq in range(1, 5):
        Event.objects.create(
            session=session, seq=seq, type="progress", data={"stage": "x" * 400_000, "turn": 1}
        )
    Event.objects.create(session=session, seq=5, type="progress", data={"stage": "last", "turn": 1})
    url = f"{BASE}{session_id}/events/"

    pages: list[list[int]] = []
    response = api.get(url, {"after": 0, "limit": 1000})
    while True:
        pages.append([e["seq"] for e in response.json()])
        link = response.get("Link")
        if link is None:
            break
        # The next page is the link as given: the cursor is the page's last seq.
        assert link == f'<{url}?after={pages[-1][-1]}&limit=1000>; rel="next"'
        response = api.get(url, {"after": pages[-1][-1], "limit": 1000})
    assert pages == [[1, 2], [3, 4, 5]]
    assert sum(len(p) for p in pages) == 5

    # One event larger than the budget is a page of its own; a full page by count links on.
    Event.objects.create(
        session=session, seq=6, type="progress", data={"stage": "y" * 1_500_000, "turn": 1}
    )
    Event.objects.create(session=session, seq=7, type="progress", data={"stage": "z", "turn": 1})
    big = api.get(url, {"after": 5})
    assert [e["seq"] for e in big.json()] == [6] and "after=6" in big["Link"]
    by_count = api.get(url, {"after": 0, "limit": 1})
    assert [e["seq"] for e in by_count.json()] == [1] and "after=1&limit=1" in by_count["Link"]
    assert "Link" not in api.get(url, {"after": 6})


def _follow(api, url: str, params: dict) -> list[list]:  # type: ignore[no-untyped-def]
    """Every page, by the Link headers, as the JSON lists they are."""
    import re

    pages = []
    while True:
        response = api.get(url, params)
        assert response.status_code == 200, response.content
        pages.append(response.json())
        link = response.headers.get("Link")
        if link is None:
            return pages
        target = re.match(r'<([^>]+)>; rel="next"', link)
        assert target is not None, link
        url, _, query = target.group(1).partition("?")
        params = dict(part.split("=", 1) for part in query.split("&"))


def test_the_session_list_pages_by_cursor_through_every_session(api):
    created = [api.post(BASE, {"agent": "helper"}).json()["id"] for _ in range(5)]
    Session.objects.filter(pk=created[0]).update(ephemeral=True)
    # Two created in the same microsecond are told apart by their id.
    same = Session.objects.get(pk=created[1]).created_at
    Session.objects.filter(pk=created[2]).update(created_at=same)

    pages = _follow(api, BASE, {"limit": 2})
    assert [len(p) for p in pages] == [2, 2]
    listed = [s["id"] for p in pages for s in p]
    assert len(set(listed)) == 4 and set(listed) == set(created[1:])
    order = list(
        Session.objects.filter(pk__in=created[1:])
        .order_by("-created_at", "-pk")
        .values_list("pk", flat=True)
    )
    assert listed == [str(pk) for pk in order]
    with_ephemeral = _follow(api, BASE, {"limit": 2, "ephemeral": "true"})
    assert [len(p) for p in with_ephemeral] == [2, 2, 1]
    assert {s["id"] for p in with_ephemeral for s in p} == set(created)
    assert_error(api.get(BASE, {"before": "not-a-cursor"}), 400, "invalid_input")


def test_the_message_list_pages_back_through_the_history(api, session_id):
    from record.models import Message

    session = Session.objects.get(pk=session_id)
    for seq in range(1, 6):
        Message.objects.create(session=session, seq=seq, turn=1, role="user", content=f"m{seq}")
    Session.objects.filter(pk=session_id).update(message_seq=5)
    Message.objects.create(
        session=session, seq=None, turn=1, role="user", content="queued", status="queued"
    )

    pages = _follow(api, f"{BASE}{session_id}/messages/", {"limit": 2})
    assert [[m["content"] for m in p] for p in pages] == [
        ["m5", "queued"],
        ["m3", "m4"],
        ["m1", "m2"],
    ]


@pytest.mark.parametrize(
    "webhook",
    [
        {"url": "http://127.0.0.1:8000/internal"},
        {"url": "http://169.254.169.254/latest/meta-data/"},
        {"url": "file:///etc/passwd"},
        {"url": ["http://x.example"]},
        "http://x.example",
        None,
    ],
)
def test_a_webhook_the_egress_policy_or_its_shape_refuses_is_a_400_naming_it(
    api, session_id, settings, webhook
):
    settings.EGRESS_ALLOW = []
    for path, body in (
        (BASE, {"agent": "helper"}),
        (f"{BASE}{session_id}/messages/", {"content": "hi"}),
    ):
        error = assert_error(api.post(path, {**body, "webhook": webhook}), 400)
        # Named by the service ({"field": "webhook.url"}) or, for null, by the serializer.
        named = error["details"].get("field") or next(
            iter(error["details"].get("fields", error["details"]))
        )
        assert named in ("webhook", "webhook.url"), error
    assert not Session.objects.exclude(pk=session_id).exists()
    assert not Session.objects.get(pk=session_id).messages.exists()


def test_a_session_and_a_message_take_a_webhook(api, session_id):
    created = api.post(BASE, {"agent": "helper", "webhook": {"url": "http://127.0.0.1:9/s"}})
    assert created.status_code == 201, created.content
    posted = api.post(
        f"{BASE}{session_id}/messages/",
        {"content": "hi", "webhook": {"url": "http://127.0.0.1:9/m"}},
    )
    assert posted.status_code == 202, posted.content
    assert sorted(RunWebhook.objects.values_list("url", "message_id")) == [
        ("http://127.0.0.1:9/m", posted.json()["id"]),
        ("http://127.0.0.1:9/s", None),
    ]
