"""The `make run` banner waits for /readyz, then prints URLs and credentials."""

import http.server
import threading
from collections.abc import Iterator

import pytest

from devstack import banner, paths


class _Readyz(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self) -> None:  # noqa: N802
        status = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        body = b'{"checks": {"sweeper": "no sweep has completed"}}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def readyz_server() -> Iterator[tuple[str, type[_Readyz]]]:
    handler = type("Handler", (_Readyz,), {"answers": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_prints_after_ready_and_deletes_a_one_time_credentials_file(
    readyz_server, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(banner, "POLL_S", 0.01)
    base, handler = readyz_server
    handler.answers = [503, 503, 200]
    handover = tmp_path / "credentials"
    handover.write_text("OPERATOR_USERNAME=operator\nOPERATOR_PASSWORD=pw-1\nDEMO_API_KEY=ap_k\n")

    assert banner.wait_and_print(base, handover, timeout_s=10) == 0

    out = capsys.readouterr()
    assert handler.answers == [200]  # it polled until ready
    assert f"playground  {base}/playground/" in out.out
    assert "username 'operator', password 'pw-1'" in out.out
    assert "API key     ap_k" in out.out
    assert "web, worker, beat and demoapi" in out.out
    assert out.err == ""
    assert not handover.exists()  # outside .data/: a one-time hand-over


def test_keeps_the_embedded_credentials_file_and_says_where(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA_DIR", tmp_path.resolve())
    kept = tmp_path / "credentials"
    kept.write_text("DEMO_API_KEY=ap_k\n")
    text = banner.banner("http://127.0.0.1:8000", kept)
    assert "ap_k" in text and f"credentials saved in {kept}" in text
    assert "password shown on the first run" in text


def test_gives_up_waiting_with_the_reason(readyz_server, capsys, monkeypatch):
    monkeypatch.setattr(banner, "POLL_S", 0.01)
    base, handler = readyz_server
    handler.answers = [503]
    banner.wait_and_print(base, None, timeout_s=0.3)
    out = capsys.readouterr()
    assert "not ready after 0.3 s" in out.err and "no sweep has completed" in out.err
    assert "admin       " in out.out
