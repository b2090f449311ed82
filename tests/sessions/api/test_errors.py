"""Bad input, other owners' sessions and odd URLs: the right status, one error shape, never a 500."""

import json
import uuid

import pytest
from django.test import override_settings

from record.models import Message, Session

from .conftest import assert_error

pytestmark = pytest.mark.django_db

BASE = "/api/v1/sessions/"


# owner isolation ----------------------------------------------------------------------


def test_another_owners_session_is_404_on_every_endpoint(api, other_api, session_id):
    api.post(f"{BASE}{session_id}/messages/", {"content": "mine"})
    before = Session.objects.get(pk=session_id)

    calls = [
        other_api.get(f"{BASE}{session_id}/"),
        other_api.get(f"{BASE}{session_id}/messages/"),
        other_api.post(f"{BASE}{session_id}/messages/", {"content": "not yours"}),
        other_api.get(f"{BASE}{session_id}/events/"),
        other_api.post(f"{BASE}{session_id}/cancel/"),
    ]
    for response in calls:
        error = assert_error(response, 404, "not_found")
        assert "mine" not in json.dumps(error)

    after = Session.objects.get(pk=session_id)
    assert (after.version, after.cancel_requested, after.queued_count) == (before.version, False, 0)
    assert list(Message.objects.values_list("content", flat=True)) == ["mine"]
    assert other_api.get(BASE).json() == []


def test_a_session_that_does_not_exist_is_404(api):
    missing = uuid.uuid4()
    for response in [
        api.get(f"{BASE}{missing}/"),
        api.get(f"{BASE}{missing}/messages/"),
        api.post(f"{BASE}{missing}/messages/", {"content": "x"}),
        api.get(f"{BASE}{missing}/events/"),
        api.post(f"{BASE}{missing}/cancel/"),
    ]:
        assert_error(response, 404, "not_found")


def test_a_post_to_a_session_not_yours_is_404_whatever_its_body(api, other_api, session_id):
    # The ownership check sits in the post's locking query; a bad body must not
    # tell a stranger (or a typo) more than "not found", as before.
    missing = uuid.uuid4()
    for client, sid in [(api, missing), (other_api, session_id)]:
        url = f"{BASE}{sid}/messages/"
        for response in [
            client.post(url, {"content": ""}),
            client.post(url, {"content": 5}),
            client.post(url, {"content": "x", "extra": 1}),
            client.post(url, {"content": "x" * 1_000_000}),
            client.post_raw(url, "{not json"),
            client.post_raw(url, "[" * 5000 + "]" * 5000),
        ]:
            assert_error(response, 404, "not_found")
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    "path", ["not-a-uuid/", "123/", "not-a-uuid/messages/", "x/events/", "x/cancel/"]
)
def test_a_non_uuid_id_is_a_json_404(api, path):
    assert_error(api.get(f"{BASE}{path}"), 404, "not_found")
    assert_error(api.post(f"{BASE}{path}", {"content": "x"}), 404, "not_found")


def test_an_unknown_api_path_is_a_json_404(api):
    assert_error(api.get("/api/v1/nothing-here/"), 404, "not_found")


def test_a_wrong_method_is_405_in_the_error_shape(api, session_id):
    assert_error(api.client.delete(f"{BASE}{session_id}/"), 405, "method_not_allowed")
    assert_error(api.get(f"{BASE}{session_id}/cancel/"), 405, "method_not_allowed")


# creating sessions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "agent"),
        ({"agent": ""}, "agent"),
        ({"agent": "helper", "metadata": "x"}, "metadata"),
        ({"agent": "helper", "metadata": [1, 2]}, "metadata"),
        ({"agent": ["helper"]}, "agent"),
        ({"agent": "helper", "colour": "blue"}, "colour"),
        ({"agent": "helper", "role": 5}, "role"),
        ({"agent": 123}, "agent"),
        ({"agent": True}, "agent"),
    ],
)
def test_bad_session_bodies_are_400(api, payload, field):
    error = assert_error(api.post(BASE, payload), 400, "invalid_input")
    assert field in error["details"], error
    assert error["message"].startswith(f"{field}:")
    assert not Session.objects.exists()


def test_an_unknown_agent_is_400(api):
    error = assert_error(api.post(BASE, {"agent": "nobody"}), 400, "unknown_agent")
    assert error["details"] == {"field": "agent"}


def test_a_nul_character_in_metadata_is_400_not_500(api):
    assert_error(
        api.post(BASE, {"agent": "helper", "metadata": {"a": "x\u0000y"}}), 400, "invalid_input"
    )
    assert_error(
        api.post(BASE, {"agent": "helper", "metadata": {"a\u0000": 1}}), 400, "invalid_input"
    )


# posting messages -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "content"),
        ({"content": None}, "content"),
        ({"content": 123}, "content"),
        ({"content": 1.5}, "content"),
        ({"content": True}, "content"),
        ({"content": ["hi"]}, "content"),
        ({"content": {"text": "hi"}}, "content"),
        ({"content": "hi", "idempotency_key": ""}, "idempotency_key"),
        ({"content": "hi", "idempotency_key": 7}, "idempotency_key"),
        ({"content": "hi", "idempotency_key": "k" * 201}, "idempotency_key"),
        ({"content": "hi", "metadata": {}}, "metadata"),
        ({"content": "nul \u0000 inside"}, "content"),
    ],
)
def test_bad_message_bodies_are_400(api, session_id, payload, field):
    error = assert_error(api.post(f"{BASE}{session_id}/messages/", payload), 400, "invalid_input")
    assert field in error["details"], error
    assert not Message.objects.exists()


@pytest.mark.parametrize("content", ["", "   ", "\n"])
def test_empty_content_is_400(api, session_id, content):
    error = assert_error(
        api.post(f"{BASE}{session_id}/messages/", {"content": content}), 400, "invalid_input"
    )
    assert error["details"] == {"field": "content"}


@override_settings(MAX_MESSAGE_CHARS=100)
def test_content_over_the_limit_is_413(api, session_id):
    url = f"{BASE}{session_id}/messages/"
    error = assert_error(api.post(url, {"content": "x" * 101}), 413, "payload_too_large")
    assert error["details"] == {"field": "content", "limit": 100}
    assert api.post(url, {"content": "x" * 100}).status_code == 202


def test_content_over_the_default_limit_is_413(api, session_id, settings):
    content = "x" * (settings.MAX_MESSAGE_CHARS + 1)
    assert_error(
        api.post(f"{BASE}{session_id}/messages/", {"content": content}), 413, "payload_too_large"
    )


@pytest.mark.parametrize(
    "body", ['{"content": "hi"', "not json", '{"content": "hi",}', "\xff\xfe", '{"content": NaN}']
)
def test_malformed_json_is_400(api, session_id, body):
    for url in (BASE, f"{BASE}{session_id}/messages/"):
        error = assert_error(api.post_raw(url, body), 400, "malformed_json")
        assert error["message"] == "request body is not valid JSON"


@pytest.mark.parametrize("body", ["[]", '["hi"]', '"hi"', "42", "null", "true"])
def test_a_body_that_is_not_an_object_is_400(api, session_id, body):
    for url in (BASE, f"{BASE}{session_id}/messages/"):
        assert_error(api.post_raw(url, body), 400, "invalid_input")


def test_a_non_json_content_type_is_415(api, session_id):
    response = api.post_raw(
        f"{BASE}{session_id}/messages/", "content=hi", "application/x-www-form-urlencoded"
    )
    assert_error(response, 415, "unsupported_media_type")


# query parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("messages/", {"limit": "abc"}, "limit"),
        ("messages/", {"limit": "0"}, "limit"),
        ("messages/", {"limit": "-5"}, "limit"),
        ("messages/", {"limit": "100000"}, "limit"),
        ("messages/", {"limit": "1.5"}, "limit"),
        ("events/", {"after": "-1"}, "after"),
        ("events/", {"after": "abc"}, "after"),
        ("events/", {"after": str(2**40)}, "after"),
        ("events/", {"after": "0", "limit": "0"}, "limit"),
    ],
)
def test_bad_query_parameters_are_400(api, session_id, path, params, field):
    error = assert_error(api.get(f"{BASE}{session_id}/{path}", params), 400, "invalid_input")
    assert error["details"] == {"field": field}
    assert field in error["message"]


def test_bad_list_limit_is_400(api):
    assert_error(api.get(BASE, {"limit": "lots"}), 400, "invalid_input")
