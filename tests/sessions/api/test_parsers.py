"""Hostile JSON bodies: deep, huge, non-finite, lone surrogates. Always a 4xx in the
error shape, and nothing stored (issue 15, item 2)."""

import json

import pytest
from django.test import override_settings

from record.models import Event, Message, Session

from .conftest import assert_error

pytestmark = pytest.mark.django_db

BASE = "/api/v1/sessions/"


def _rows() -> tuple[int, int, int]:
    return Session.objects.count(), Message.objects.count(), Event.objects.count()


def _nested(depth: int, kind: str) -> str:
    """A JSON value `depth` containers deep, written out (no recursion)."""
    if kind == "list":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


@pytest.fixture
def urls(session_id: str) -> list[str]:
    return [BASE, f"{BASE}{session_id}/messages/"]


# nesting --------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [33, 330, 1_000, 10_000, 100_000])
@pytest.mark.parametrize("kind", ["list", "object"])
def test_a_deeply_nested_body_is_400(api, urls, depth, kind):
    before = _rows()
    for url in urls:
        error = assert_error(api.post_raw(url, _nested(depth, kind)), 400, "invalid_input")
        assert error["details"]["reason"] == "nested deeper than 32 levels", error
        assert error["details"]["limit"] == 32
    assert _rows() == before


@pytest.mark.parametrize("depth", [32, 330, 1_000, 50_000])
@pytest.mark.parametrize("kind", ["list", "object"])
def test_deeply_nested_metadata_is_400(api, depth, kind):
    before = _rows()
    body = '{"agent": "helper", "metadata": {"deep": ' + _nested(depth, kind) + "}}"
    error = assert_error(api.post_raw(BASE, body), 400, "invalid_input")
    assert "nested deeper than 32 levels" in error["message"], error
    assert _rows() == before


def test_metadata_up_to_the_depth_limit_is_stored(api):
    # The body is one level, metadata one more: 30 lists inside make 32.
    body = '{"agent": "helper", "metadata": {"deep": ' + _nested(30, "list") + "}}"
    response = api.post_raw(BASE, body)
    assert response.status_code == 201, response.content
    assert Session.objects.get().metadata == json.loads(body)["metadata"]


@override_settings(JSON_MAX_DEPTH=4)
def test_the_depth_limit_comes_from_settings(api, session_id):
    ok = api.post(BASE, {"agent": "helper", "metadata": {"a": {"b": [1]}}})
    assert ok.status_code == 201, ok.content
    error = assert_error(
        api.post(BASE, {"agent": "helper", "metadata": {"a": {"b": [[1]]}}}), 400, "invalid_input"
    )
    assert error["details"] == {
        "path": "$.metadata.a.b[0]",
        "reason": "nested deeper than 4 levels",
        "limit": 4,
    }


# numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("literal", "reason"),
    [
        ("1e400", "number is out of range (not a finite double)"),
        ("-1e400", "number is out of range (not a finite double)"),
        ("1" * 3000 + ".5", "number has more than 100 characters"),
        ("0." + "1" * 3000, "number has more than 100 characters"),
        ("9" * 3000, "number has more than 100 characters"),
    ],
)
def test_non_finite_or_overlong_numbers_are_400(api, session_id, literal, reason):
    before = _rows()
    body = '{"agent": "helper", "metadata": {"n": [0, ' + literal + "]}}"
    error = assert_error(api.post_raw(BASE, body), 400, "invalid_input")
    assert error["details"] == {"path": "$.metadata.n[1]", "reason": reason}
    assert error["message"] == f"$.metadata.n[1]: {reason}"
    body = '{"content": "hi", "extra": ' + literal + "}"
    assert_error(api.post_raw(f"{BASE}{session_id}/messages/", body), 400, "invalid_input")
    assert _rows() == before


def test_ordinary_numbers_in_metadata_are_kept(api):
    body = '{"agent": "helper", "metadata": {"n": [1e300, -2.5e-300, 12345678901234567890, 0]}}'
    response = api.post_raw(BASE, body)
    assert response.status_code == 201, response.content
    assert response.json()["metadata"] == {"n": [1e300, -2.5e-300, 12345678901234567890, 0]}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_malformed(api, constant):
    body = '{"agent": "helper", "metadata": {"n": ' + constant + "}}"
    assert_error(api.post_raw(BASE, body), 400, "malformed_json")
    assert not Session.objects.exists()


# lone surrogates ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "body", "path"),
    [
        ("metadata value", '{"agent": "helper", "metadata": {"a": "x\\ud800"}}', "$.metadata.a"),
        (
            "metadata key",
            '{"agent": "helper", "metadata": {"\\udfff": 1}}',
            '$.metadata["\\udfff"]',
        ),
        (
            "nested",
            '{"agent": "helper", "metadata": {"a": [{"b": "\\udc00y"}]}}',
            "$.metadata.a[0].b",
        ),
        ("agent", '{"agent": "\\ud800"}', "$.agent"),
        ("unknown field", '{"agent": "helper", "\\ud800": 1}', '$["\\ud800"]'),
    ],
)
def test_a_lone_surrogate_in_a_session_body_is_400(api, where, body, path):
    error = assert_error(api.post_raw(BASE, body), 400, "invalid_input")
    assert error["details"]["path"] == path, (where, error)
    assert "lone surrogate" in error["details"]["reason"], where
    assert not Session.objects.exists()


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ('{"content": "hi \\ud800 there"}', "$.content"),
        ('{"content": "\\udbff"}', "$.content"),
        ('{"content": "hi", "idempotency_key": "k\\udc00"}', "$.idempotency_key"),
    ],
)
def test_a_lone_surrogate_in_a_message_is_400(api, session_id, body, path):
    before = _rows()
    error = assert_error(api.post_raw(f"{BASE}{session_id}/messages/", body), 400, "invalid_input")
    assert error["details"]["path"] == path, error
    assert _rows() == before


def test_a_surrogate_pair_is_ordinary_text(api, session_id):
    body = '{"content": "smile \\ud83d\\ude00"}'
    response = api.post_raw(f"{BASE}{session_id}/messages/", body)
    assert response.status_code == 202, response.content
    assert Message.objects.get().content == "smile \U0001f600"


def test_surrogate_bytes_that_are_not_utf8_are_malformed(api, session_id):
    body = b'{"content": "\xed\xa0\x80"}'
    assert_error(api.post_raw(f"{BASE}{session_id}/messages/", body), 400, "malformed_json")
    assert not Message.objects.exists()


# size -----------------------------------------------------------------------------------


def test_a_body_over_the_upload_limit_is_413(api, session_id, settings):
    before = _rows()
    content = "x" * 3_000_000
    for url, payload in [
        (f"{BASE}{session_id}/messages/", {"content": content}),
        (BASE, {"agent": "helper", "metadata": {"a": content}}),
    ]:
        error = assert_error(api.post(url, payload), 413, "payload_too_large")
        assert error["details"] == {"limit": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}
    assert _rows() == before


@override_settings(METADATA_MAX_BYTES=100)
def test_metadata_over_its_size_limit_is_413(api):
    # {"a":"..."} is 8 bytes around the string.
    fits = {"a": "é" * 46}  # 92 bytes of UTF-8
    assert api.post(BASE, {"agent": "helper", "metadata": fits}).status_code == 201
    error = assert_error(
        api.post(BASE, {"agent": "helper", "metadata": {"a": "é" * 47}}), 413, "payload_too_large"
    )
    assert error["details"] == {"field": "metadata", "limit": 100}
    assert error["message"] == "metadata: is 102 bytes as compact JSON; the limit is 100"
    assert Session.objects.count() == 1


def test_metadata_over_the_default_size_limit_is_413(api, settings):
    big = {"k": "x" * settings.METADATA_MAX_BYTES}
    assert_error(api.post(BASE, {"agent": "helper", "metadata": big}), 413, "payload_too_large")
    assert not Session.objects.exists()


# other encodings of a body --------------------------------------------------------------


def test_a_multipart_body_is_415_in_the_error_shape(api, session_id):
    response = api.client.post(
        f"{BASE}{session_id}/messages/", {"content": "hi"}, format="multipart"
    )
    assert_error(response, 415, "unsupported_media_type")
    assert not Message.objects.exists()


def test_a_non_text_charset_is_400(api, session_id):
    response = api.post_raw(
        f"{BASE}{session_id}/messages/", b'{"content": "hi"}', "application/json; charset=bz2_codec"
    )
    assert_error(response, 400, "malformed_json")
    assert not Message.objects.exists()


def test_a_nul_in_a_query_parameter_is_400(api, session_id):
    for path in [BASE, f"{BASE}{session_id}/messages/", f"{BASE}{session_id}/events/"]:
        error = assert_error(api.client.get(path + "?limit=%00"), 400, "invalid_input")
        assert error["details"] == {"parameter": "limit"}
