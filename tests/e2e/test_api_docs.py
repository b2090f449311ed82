"""Swagger UI and Redoc work offline: every file their pages load comes from the live server."""

import json
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


@pytest.mark.skipif(_chromium() is None, reason="needs chromium and the playwright package")
def test_swagger_try_it_out_fills_in_the_demo_request_and_links_the_websocket_page(
    live_stack: Stack,
) -> None:
    """The body "Try it out" offers for opening a session names the demo's agent (not a
    random string that fails with unknown_agent), and the header links the websocket page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{live_stack.http}/api/v1/docs/")
            operation = page.locator("#operations-sessions-sessions_create")
            operation.locator(".opblock-summary").click()
            operation.locator(".try-out__btn").click()
            body = operation.locator("textarea.body-param__text").input_value(timeout=10_000)
            links = page.locator('.info a[href="/api/v1/docs/websocket/"]').count()
            page.goto(f"{live_stack.http}/api/v1/docs/websocket/")
            heading = page.locator("h1").inner_text()
        finally:
            browser.close()
    assert json.loads(body) == {"agent": "order-support", "metadata": {"customer_ref": "crm-4711"}}
    assert links >= 1
    assert heading == "Websocket protocol"
