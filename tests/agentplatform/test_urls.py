"""The site root is a small landing page, and the admin's "View site" link leads to it."""

import re

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_root_is_a_landing_page_linking_to_everything(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    links = set(re.findall(r'href="([^"]+)"', response.content.decode()))
    expected = {
        reverse("playground"),
        reverse("admin:index"),
        reverse("docs"),
        reverse("redoc"),
        reverse("schema"),
        reverse("healthz"),
        reverse("readyz"),
    }
    assert expected <= links, links
    # Self-contained like the playground: nothing loaded from elsewhere.
    assert "https://" not in response.content.decode()


def test_every_landing_page_link_answers(client):
    page = client.get("/").content.decode()
    for link in re.findall(r'href="(/[^"]*)"', page):
        response = client.get(link, follow=True)
        # /readyz may say 503 without a worker; it still answers.
        assert response.status_code in (200, 503), (link, response.status_code)


def test_the_admin_view_site_link_leads_to_the_landing_page(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    view_site = re.search(r'<a href="([^"]+)">View site</a>', page)
    assert view_site is not None, page
    assert view_site.group(1) == "/"
    assert b"Agent platform" in admin_client.get(view_site.group(1)).content


def test_the_landing_page_refuses_writes(client):
    assert client.post("/").status_code == 405


def test_a_refusal_in_the_admin_is_a_styled_admin_page(client):
    from billing.services import credits_grant
    from tests.factories import StaffUserFactory

    staff = StaffUserFactory(username="viewer", perms=["billing.view_creditaccount"])
    account = credits_grant(owner_id=staff.pk, points=5, actor="test")
    client.force_login(staff)
    url = reverse("admin:billing_creditaccount_points", args=[account.pk, "grant"])
    page = client.get(url, HTTP_REFERER="http://testserver/admin/")
    html = page.content.decode()
    assert page.status_code == 403 and page["Content-Type"].startswith("text/html")
    assert "Not allowed (403)" in html and "<strong>viewer</strong>" in html
    assert 'id="site-name"' in html and 'href="http://testserver/admin/"' in html  # back
    assert "403 Forbidden" not in html


def test_a_refusal_outside_the_admin_answers_in_the_apis_shape(rf):
    from restapi.errors_http import forbidden

    response = forbidden(rf.get("/somewhere/"))
    assert response.status_code == 403
    assert b'"code": "permission_denied"' in response.content


def test_a_page_not_found_in_the_admin_is_an_admin_page_and_json_elsewhere(admin_client):
    page = admin_client.get("/admin/billing/creditaccount/999/points/grant/")
    assert page.status_code == 404 and "Not found (404)" in page.content.decode()
    assert 'id="site-name"' in page.content.decode()
    api = admin_client.get("/api/v1/nowhere/")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
