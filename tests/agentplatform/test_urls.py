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
