"""runtime/egress.py: which addresses outbound calls may reach, checked on the resolved address,
connected to as checked (no second resolution), with the URL's Host and TLS name, no redirects."""

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from runtime import egress, io_loop
from runtime.egress import EgressRefused, parse_allow, refusal

# policy ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("10.2.3.4", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd12::1", "private"),
        ("fc00::1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%2", "link-local"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("240.1.2.3", "reserved"),
        ("192.0.2.1", "reserved"),
        ("2001:db8::1", "reserved"),
        ("::7f00:1", "reserved"),  # IPv4-compatible
        # IPv4 inside IPv6: judged by the IPv4 address it reaches.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "metadata"),
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ],
)
def test_internal_addresses_are_refused_by_kind(address: str, why: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
)
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None
    parse_allow([]).check("example.org", ipaddress.ip_address(address))


def _refused(policy: egress.EgressPolicy, host: str, address: str) -> bool:
    try:
        policy.check(host, ipaddress.ip_address(address))
    except EgressRefused:
        return True
    return False


def test_cidr_entries_allow_their_range_in_both_spellings_of_an_ipv4_address() -> None:
    policy = parse_allow(["127.0.0.0/8", " 10.2.0.0/16 ", "", "[::1]"])
    assert not _refused(policy, "x", "127.0.0.5")
    assert not _refused(policy, "x", "::ffff:127.0.0.5")
    assert not _refused(policy, "x", "10.2.200.1")
    assert not _refused(policy, "x", "::1")
    assert _refused(policy, "x", "10.3.0.1")
    assert _refused(policy, "x", "192.168.0.1")


def test_a_single_address_entry_allows_that_address_alone() -> None:
    policy = parse_allow(["127.0.0.1"])
    assert not _refused(policy, "127.0.0.1", "127.0.0.1")
    assert _refused(policy, "127.0.0.2", "127.0.0.2")


def test_host_entries_allow_what_that_name_resolves_to() -> None:
    policy = parse_allow(["api.internal", "*.corp.example"])
    assert not _refused(policy, "api.internal", "10.0.0.7")
    assert not _refused(policy, "API.Internal.", "10.0.0.7")  # DNS names: any case, root dot
    assert not _refused(policy, "billing.corp.example", "10.0.0.8")
    assert _refused(policy, "corp.example", "10.0.0.8")  # the pattern is for sub-domains
    assert _refused(policy, "api.internal.evil.example", "10.0.0.7")
    assert _refused(policy, "other.internal", "10.0.0.7")


def test_metadata_addresses_need_their_own_entry_not_a_range_or_a_host_name() -> None:
    broad = parse_allow(["169.254.0.0/16", "fd00::/8", "metadata.google.internal"])
    assert not _refused(broad, "x", "169.254.10.10")  # link-local services: allowed
    assert _refused(broad, "x", "169.254.169.254")
    assert _refused(broad, "x", "fd00:ec2::254")
    assert _refused(broad, "metadata.google.internal", "169.254.169.254")
    exact = parse_allow(["169.254.169.254"])
    assert not _refused(exact, "x", "169.254.169.254")
    assert not _refused(exact, "x", "::ffff:169.254.169.254")


@pytest.mark.parametrize(
    "entry", ["10.0.0.0/33", "http://10.0.0.1", "127.0.0.1:8765", "bad host", "a..b", "*"]
)
def test_an_entry_that_means_nothing_is_a_configuration_error_naming_it(entry: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="EGRESS_ALLOW") as raised:
        parse_allow(["127.0.0.1", entry])
    assert repr(entry) in str(raised.value)
    with override_settings(EGRESS_ALLOW=[entry]):
        [error] = egress.check()
    assert error.id == "runtime.E002" and repr(entry) in error.msg


def test_the_setting_is_read_as_a_list_or_as_the_raw_comma_separated_text() -> None:
    with override_settings(EGRESS_ALLOW="10.0.0.0/8,svc.internal"):
        policy = egress.current_policy()
    assert policy.hosts == frozenset({"svc.internal"}) and len(policy.networks) == 1
    with override_settings(EGRESS_ALLOW=[]):
        assert egress.check() == []


def test_the_refusal_names_the_host_and_the_address_kind_never_the_url() -> None:
    refused = EgressRefused("db.internal", "10.0.0.5", "private")
    assert str(refused) == (
        "egress refused: db.internal resolves to 10.0.0.5, a private address "
        "that EGRESS_ALLOW does not list"
    )
    assert str(EgressRefused("::1", "::1", "loopback")).startswith(
        "egress refused: ::1 is a loopback address"
    )


# the clients, against real servers ---------------------------------------------------------------


@dataclass
class _Seen:
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Host


@contextmanager
def _server(
    address: str = "127.0.0.1",
    port: int = 0,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> Iterator[tuple[int, _Seen]]:
    """A server on `address` that records every request and answers `status`."""
    seen = _Seen()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            seen.requests.append((self.command, self.path, self.headers.get("Host", "")))
            body = b'{"secret": "internal answer"}'
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815 - http.server's names

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _sync_get(url: str) -> httpx.Response:
    with egress.client(timeout=5) as client:
        return client.get(url)


def _async_get(url: str) -> httpx.Response:
    async def get() -> httpx.Response:
        async with egress.async_client(timeout=5) as client:
            return await client.get(url)

    return io_loop.run(get(), timeout=10)


def _mcp_get(url: str) -> Any:
    """Through the MCP SDK's HTTP library (httpx2), as tools/mcp.py builds its client."""

    async def get() -> Any:
        async with egress.mcp_async_client(timeout=5) as client:
            return await client.get(url)

    return io_loop.run(get(), timeout=10)


CLIENTS: dict[str, Callable[[str], Any]] = {
    "sync": _sync_get,
    "async": _async_get,
    "mcp": _mcp_get,
}


@pytest.fixture(params=sorted(CLIENTS))
def get(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    return CLIENTS[request.param]


@pytest.mark.parametrize(
    "spelling",
    [
        "http://127.0.0.1:{port}/",
        "http://0x7f.1:{port}/",  # hexadecimal, two parts
        "http://2130706433:{port}/",  # one decimal number
        "http://017700000001:{port}/",  # one octal number
        "http://127.1:{port}/",
        "http://[::ffff:127.0.0.1]:{port}/",
        "http://[::ffff:7f00:1]:{port}/",
        "http://evil@127.0.0.1:{port}/",  # userinfo: the host is what follows the @
        "http://example.org@127.0.0.1:{port}/",
        "http://localhost:{port}/",
    ],
)
def test_every_spelling_of_loopback_is_refused_and_nothing_is_sent(
    get: Callable[[str], Any], spelling: str
) -> None:
    with (
        _server() as (port, seen),
        override_settings(EGRESS_ALLOW=[]),
        pytest.raises(EgressRefused, match="loopback address"),
    ):
        get(spelling.format(port=port))
    assert seen.requests == []


def test_a_dotted_octal_address_is_not_even_a_url_to_the_http_library(
    get: Callable[[str], Any],
) -> None:
    with (
        _server() as (port, seen),
        override_settings(EGRESS_ALLOW=[]),
        pytest.raises(Exception, match="Invalid IPv4 address") as raised,
    ):
        get(f"http://0177.0.0.1:{port}/")
    assert type(raised.value).__name__ == "InvalidURL" and seen.requests == []


def test_the_same_request_goes_through_once_its_address_is_allowed(
    get: Callable[[str], Any],
) -> None:
    with _server() as (port, seen), override_settings(EGRESS_ALLOW=["127.0.0.0/8"]):
        response = get(f"http://0x7f.1:{port}/ok")
    assert response.status_code == 200
    assert seen.requests == [("GET", "/ok", f"0x7f.1:{port}")]


def test_metadata_and_unix_sockets_are_refused() -> None:
    with override_settings(EGRESS_ALLOW=["169.254.0.0/16"]), pytest.raises(EgressRefused):
        _sync_get("http://169.254.169.254/latest/meta-data/")
    with pytest.raises(EgressRefused, match="unix socket"):
        egress._SyncBackend(egress.httpcore).connect_unix_socket("/run/docker.sock")


class Resolver:
    """`socket.getaddrinfo` (what every resolution ends in, the event loop's too) answering
    scripted addresses for some names: the next answer at each call, the last one repeated;
    every other name goes to the real resolver."""

    def __init__(self) -> None:
        self.answers: dict[str, list[list[str]]] = {}
        self.asked: list[str] = []
        self._real = socket.getaddrinfo

    def __setitem__(self, name: str, answers: list[list[str]]) -> None:
        self.answers[name] = [list(answer) for answer in answers]

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.answers:
            return self._real(host, port, *args, **kwargs)
        self.asked.append(name)
        scripted = self.answers[name]
        answer = scripted.pop(0) if len(scripted) > 1 else scripted[0]
        return [
            (
                socket.AF_INET6 if ":" in address else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (address, int(port or 0)),
            )
            for address in answer
        ]


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    fake = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


def test_a_name_resolving_to_a_refused_address_is_refused(
    get: Callable[[str], Any], resolver: Resolver
) -> None:
    resolver["rebind.test"] = [["127.0.0.1"]]
    with (
        _server() as (port, seen),
        override_settings(EGRESS_ALLOW=[]),
        pytest.raises(EgressRefused, match=r"rebind\.test resolves to 127\.0\.0\.1"),
    ):
        get(f"http://rebind.test:{port}/")
    assert seen.requests == []


def test_the_connection_goes_to_the_checked_address_not_to_a_second_answer(
    get: Callable[[str], Any], resolver: Resolver
) -> None:
    """DNS rebinding: the name passes the check with its first answer, then answers an
    internal address. The name is looked up once per connection and the connection goes to
    the address checked: the internal server, on the same port, sees nothing."""
    with _server("127.0.0.1") as (port, allowed), _server("127.0.0.2", port) as (_, internal):
        resolver["rebind.test"] = [["127.0.0.1"], ["127.0.0.2"]]
        with override_settings(EGRESS_ALLOW=["127.0.0.1"]):
            response = get(f"http://rebind.test:{port}/")
    assert response.status_code == 200
    assert internal.requests == []
    assert allowed.requests == [("GET", "/", f"rebind.test:{port}")]
    assert resolver.asked == ["rebind.test"]


def test_a_refused_address_among_allowed_ones_is_skipped(
    get: Callable[[str], Any], resolver: Resolver
) -> None:
    with _server("127.0.0.1") as (port, seen), _server("127.0.0.2", port) as (_, internal):
        resolver["dual.test"] = [["127.0.0.2", "127.0.0.1"]]
        with override_settings(EGRESS_ALLOW=["127.0.0.1"]):
            assert get(f"http://dual.test:{port}/").status_code == 200
    assert len(seen.requests) == 1 and internal.requests == []


def test_a_redirect_to_an_internal_address_is_an_answer_not_followed(
    get: Callable[[str], Any],
) -> None:
    with (
        _server("127.0.0.2") as (internal_port, internal),
        _server(
            "127.0.0.1",
            status=302,
            headers={"Location": f"http://127.0.0.2:{internal_port}/admin"},
        ) as (port, seen),
        override_settings(EGRESS_ALLOW=["127.0.0.1"]),
    ):
        response = get(f"http://127.0.0.1:{port}/start")
    assert response.status_code == 302
    assert len(seen.requests) == 1 and internal.requests == []


def test_proxies_from_the_environment_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy would resolve and connect on its own, past the check."""
    with _server() as (proxy_port, proxy), _server() as (port, seen):
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
        monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{proxy_port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        with override_settings(EGRESS_ALLOW=["127.0.0.1"]):
            assert _sync_get(f"http://127.0.0.1:{port}/direct").status_code == 200
            assert _async_get(f"http://127.0.0.1:{port}/direct").status_code == 200
    assert proxy.requests == [] and len(seen.requests) == 2


# TLS: the name the certificate is checked for is the URL's, though the connect goes to an address


def _tls(tmp_path: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext, list[str]]:
    """A server context with a certificate for `name` from a fresh CA, a client context that
    trusts that CA, and the server names (SNI) the server is asked for."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (tmp_path / "leaf.pem").write_bytes(
        leaf.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    names: list[str] = []
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "leaf.pem")
    server.sni_callback = lambda _sock, sni, _ctx: names.append(sni or "")  # type: ignore[assignment,misc]
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client, names


@pytest.mark.parametrize("kind", ["sync", "async", "mcp"])
def test_https_keeps_the_hosts_name_for_sni_certificate_and_host_header(
    kind: str,
    tmp_path: Path,
    resolver: Resolver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server_tls, client_tls, names = _tls(tmp_path, "api.egress.test")
    monkeypatch.setattr(egress, "_ssl_context", lambda: client_tls)
    resolver["api.egress.test"] = [["127.0.0.1"]]
    resolver["other.egress.test"] = [["127.0.0.1"]]
    with (
        _server(tls=server_tls) as (port, seen),
        override_settings(EGRESS_ALLOW=["127.0.0.1"]),
    ):
        response = CLIENTS[kind](f"https://api.egress.test:{port}/tls")
        assert response.status_code == 200
        # Connected to 127.0.0.1, yet the certificate is still checked for the URL's name.
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
            CLIENTS[kind](f"https://other.egress.test:{port}/tls")
    assert seen.requests == [("GET", "/tls", f"api.egress.test:{port}")]
    assert names[0] == "api.egress.test"
