"""The README's and the manual's examples marked `<!-- run -->` (tests/docs/blocks.py) run
against the live stack with the demo applied, as a reader runs them against `make run`.

A page's blocks run in order in one shell (Python blocks in one interpreter), with this
stack's port for 8000, a demo key for `ap_...`, and `KEY`, `API` and `SID` (a session on
the demo agent) set, as the page before the block set them. curl fails on an HTTP error
(a `.curlrc` with `fail-with-body`), so an example whose request the API refuses fails
here; each page's output must show what the page says it does (EXPECTED).
"""

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path

import httpx
import pytest

from tests.demo_setup import demo_install
from tests.docs.blocks import blocks
from tests.e2e.support import api, create_session
from tests.factories import api_key_for
from tests.stack import ROOT, Stack, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# What each page's output shows when its examples did what the page says.
EXPECTED = {
    "README.md": ['"role":"user"', '"workflow":"refund"'],
    "docs/api.md": ['"cancelled":true'],
    "docs/configuration.md": ["agent order-support"],
    "docs/cost-and-budgets.md": ["1000"],
    "docs/memory-and-context.md": ['"extra_context":{"page":"orders/SO-1001","plan":"gold"}'],
    "docs/openai-compatible.md": ["order-support"],
    "docs/workflows.md": ['"slug":"refund"'],
}
RUN = [b for b in blocks() if b.marker == "run"]


def _in_place(code: str, stack: Stack, key: str) -> str:
    code = (
        code.replace("http://127.0.0.1:8000", stack.http)
        .replace("localhost:8000", f"127.0.0.1:{stack.port}")
        .replace("ap_...", key)
    )
    code = re.sub(r"(?<![\w/])(\.venv/bin/)?python(?= manage\.py)", sys.executable, code)
    return code.replace(" manage.py", f" {ROOT / 'manage.py'}")


@pytest.fixture(scope="module")
def demo_api(live_stack: Stack) -> Iterator[str]:
    """The demo's business API (Procfile `demoapi`) on a port of its own, on the test database."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = ROOT / ".data" / "test-logs" / f"demoapi-docs-{port}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "demo_business_api", "--port", str(port)],
            cwd=ROOT,
            env=live_stack.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        # As long as a live stack may take to be ready on a loaded machine (tests/stack.py).
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "demo_business_api did not start"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_a_pages_examples_run_against_the_live_stack(
    page: str, live_stack: Stack, demo_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page_blocks = [b for b in RUN if b.page == page]
    assert page_blocks, f"{page}: no <!-- run --> example"
    monkeypatch.setenv("DEMO_API_URL", demo_api)
    demo_install()
    key = api_key_for("alice")
    (tmp_path / ".curlrc").write_text("fail-with-body\nshow-error\n")
    # They run in a directory of their own (one writes run.svg) that has the checkout's config/.
    (tmp_path / "config").symlink_to(ROOT / "config")
    env = {
        **live_stack.env,
        "DEMO_API_URL": demo_api,
        "CURL_HOME": str(tmp_path),
        "KEY": key,
        "API": f"{live_stack.http}/api/v1",
        "SID": create_session(api(live_stack, key), "order-support"),
    }
    output = []
    for language, group in groupby(page_blocks, key=lambda b: b.language):
        code = "\n".join(_in_place(b.code, live_stack, key) for b in group)
        argv = (
            [sys.executable, "-c", f"import os\nKEY = os.environ['KEY']\n{code}"]
            if language == "python"
            else ["bash", "-euo", "pipefail", "-c", code]
        )
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
        )
        where = ", ".join(b.where for b in page_blocks)
        assert done.returncode == 0, (
            f"{where}\n{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
        assert "Traceback" not in done.stderr, done.stderr
        output.append(done.stdout)
    shown = "\n".join(output)
    for expected in EXPECTED[page]:
        assert expected in shown, f"{page}: {expected!r} not in\n{shown[-3000:]}"
    if page == "docs/workflows.md":  # the run's graph, saved
        assert (tmp_path / "run.svg").read_text().lstrip().startswith("<svg")


def test_every_page_with_an_example_to_run_is_run() -> None:
    assert {b.page for b in RUN} == set(EXPECTED)


def test_an_example_whose_request_is_refused_fails(live_stack: Stack, tmp_path: Path) -> None:
    (tmp_path / ".curlrc").write_text("fail-with-body\nshow-error\n")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"curl -s {live_stack.http}/api/v1/nowhere/"],
        env={**os.environ, "CURL_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 22, done  # curl's "HTTP error" (404 here)
