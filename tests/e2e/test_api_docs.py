"""Swagger UI and Redoc work offline: every file their pages load comes from the live server."""

import re

import httpx
import pytest

from tests.stack import Stack

pytestmark = [pytest.mark.e2e]


@pytest.mark.parametrize("page", ["/api/v1/docs/", "/api/v1/redoc/"])
def test_every_file_a_docs_page_loads_is_served_locally(live_stack: Stack, page: str) -> None:
    with httpx.Client(base_url=live_stack.http, timeout=15) as client:
        html = client.get(page)
        assert html.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]*)"', html.text)
        assert any(u.endswith(".js") for u in urls), html.text
        for url in urls:
            assert url.startswith("/static/"), url
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
            assert response.content, url
            if url.endswith(".js"):
                # The real bundle, not a stub or an error page.
                assert "javascript" in response.headers["content-type"], url
                assert len(response.content) > 100_000, url
            if url.endswith(".css"):
                assert response.headers["content-type"].startswith("text/css"), url
        # The schema the page loads, too.
        assert client.get("/api/v1/schema/").status_code == 200


def _chromium() -> str | None:
    import shutil

    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return None
    return shutil.which("chromium")


@pytest.mark.skipif(_chromium() is None, reason="needs chromium and the playwright package")
def test_swagger_ui_renders_the_operations_with_the_internet_cut_off(live_stack: Stack) -> None:
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []

    def only_local(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.url.startswith(live_stack.http):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", only_local)
            page.goto(f"{live_stack.http}/api/v1/docs/")
            page.wait_for_selector(".opblock", timeout=20_000)
            paths = page.locator(".opblock-summary-path").all_inner_texts()
        finally:
            browser.close()
    assert blocked == []
    assert any("/api/v1/sessions/{session_id}/messages/" in p for p in paths), paths
