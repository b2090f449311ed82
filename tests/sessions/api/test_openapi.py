"""The OpenAPI document is valid OpenAPI 3 and describes the public contract; Swagger UI is served."""

import re

import pytest
from openapi_spec_validator import validate

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client) -> dict:  # type: ignore[no-untyped-def]
    response = client.get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200, response.content
    return response.json()


def test_the_schema_is_a_valid_openapi_3_document(schema):
    validate(schema)
    assert schema["openapi"].startswith("3.")


def test_the_schema_describes_every_public_endpoint(schema):
    paths = schema["paths"]
    expected = {
        "/api/v1/sessions/": {"get", "post"},
        "/api/v1/sessions/{session_id}/": {"get"},
        "/api/v1/sessions/{session_id}/messages/": {"get", "post"},
        "/api/v1/sessions/{session_id}/events/": {"get"},
        "/api/v1/sessions/{session_id}/cancel/": {"post"},
    }
    for path, methods in expected.items():
        assert path in paths, sorted(paths)
        assert methods <= set(paths[path]), (path, sorted(paths[path]))
    post_message = paths["/api/v1/sessions/{session_id}/messages/"]["post"]
    assert {"200", "202"} <= set(post_message["responses"])
    assert "201" in paths["/api/v1/sessions/"]["post"]["responses"]
    events_params = {
        p["name"] for p in paths["/api/v1/sessions/{session_id}/events/"]["get"]["parameters"]
    }
    assert {"after", "limit", "session_id"} <= events_params


def test_the_schema_types_the_request_bodies_strictly(schema):
    components = schema["components"]["schemas"]
    request = next(v for k, v in components.items() if k.startswith("MessageCreate"))
    assert request["properties"]["content"]["type"] == "string"
    assert "content" in request["required"]


def test_the_schema_is_also_served_as_yaml(client):
    response = client.get("/api/v1/schema/")
    assert response.status_code == 200
    assert b"openapi: 3." in response.content


def test_swagger_ui_is_served(client):
    response = client.get("/api/v1/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()


def _referenced_urls(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]*)"', html)


@pytest.mark.parametrize("page", ["/api/v1/docs/", "/api/v1/redoc/"])
def test_the_docs_pages_load_nothing_from_the_internet(client, page):
    response = client.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    urls = _referenced_urls(html)
    scripts = [u for u in urls if u.endswith(".js")]
    assert scripts, html
    for url in urls:
        # Site-relative static files only: no CDN, no protocol-relative URL, no fonts service.
        assert url.startswith("/static/drf_spectacular_sidecar/"), url
    assert "https://" not in html and "http://" not in html and "//cdn" not in html


def test_redoc_is_served(client):
    response = client.get("/api/v1/redoc/")
    assert response.status_code == 200
    assert b'<redoc spec-url="/api/v1/schema/"' in response.content
