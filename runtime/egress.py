"""The egress policy: where the platform's outbound calls may connect (DESIGN.md "Egress").

Every outbound HTTP call (HTTP tools and their status and precheck URLs, MCP
over HTTP, webhooks, model and embeddings endpoints) goes through a client
built here. Its connection pool connects through `_AsyncBackend`/`_SyncBackend`:
they resolve the host themselves, check every address, and connect to a checked
address. The name is never resolved a second time, so a DNS answer that changes
between the check and the connection (rebinding) cannot reach a refused address;
an IP literal needs no DNS at all. TLS still verifies the certificate for the
URL's host name (SNI) and the Host header is the URL's, because only the TCP
connect sees the address. Redirects are not followed: a 3xx is an answer.

Refused unless `EGRESS_ALLOW` lists them: loopback, private (RFC 1918, shared
100.64/10, ULA), link-local, unspecified, multicast, documentation and other
reserved ranges; IPv4 inside IPv6 (mapped, NAT64, 6to4) is judged by the IPv4
inside. The cloud metadata addresses are refused even inside an allowed range
or behind an allowed host name: only the address itself, listed, allows one.

Only public APIs: httpcore's connection pool takes a network backend, and a
transport hands httpx's requests to that pool (httpx's own transport takes no
backend). The same classes are built for httpx2, the fork the MCP SDK uses.
"""

import functools
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import anyio
import httpcore
import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# AWS, GCP and Azure (v4), AWS (v6) and Alibaba: credentials for whoever asks.
METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)

_REFUSED_V4 = tuple(
    (ipaddress.IPv4Network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "private"),  # shared address space (carrier-grade NAT)
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "reserved"),
        ("192.88.99.0/24", "reserved"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved"),
        ("198.51.100.0/24", "reserved"),
        ("203.0.113.0/24", "reserved"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # and the broadcast address
    )
)
_REFUSED_V6 = tuple(
    (ipaddress.IPv6Network(net), why)
    for net, why in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "private"),
        ("100::/64", "reserved"),
        ("2001::/23", "reserved"),  # Teredo, ORCHID, benchmarking...
        ("2001:db8::/32", "reserved"),
        ("fc00::/7", "private"),
        ("fe80::/10", "link-local"),
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class EgressRefused(Exception):
    """The policy refused a connection. The message names the host and the kind of address,
    never a URL's path, query or credentials."""

    def __init__(self, host: str, address: str, reason: str) -> None:
        self.host = host
        self.address = address
        self.reason = reason
        kind = f"{'an' if reason[0] in 'aeiou' else 'a'} {reason} address"
        named = host == address or _literal(host) is not None
        what = f"{host} is {kind}" if named else f"{host} resolves to {address}, {kind}"
        super().__init__(f"egress refused: {what} that EGRESS_ALLOW does not list")


def _bare(address: IPAddress) -> IPAddress:
    """The address without an IPv6 scope ("fe80::1%eth0"): ranges and sets compare bits alone."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        return ipaddress.IPv6Address(int(address))
    return address


def embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to the network (mapped, NAT64, 6to4), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


@functools.lru_cache(maxsize=4096)
def refusal(address: IPAddress) -> str | None:
    """Why the policy refuses this address unless allowed (loopback, private, ...); None: public."""
    address = _bare(address)
    if address in METADATA:
        return "metadata"
    inner = embedded_v4(address)
    if inner is not None:
        return refusal(inner)
    table: Iterable[tuple[IPNetwork, str]] = (
        _REFUSED_V4 if isinstance(address, ipaddress.IPv4Address) else _REFUSED_V6
    )
    for network, why in table:
        if address in network:
            return why
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST_V6:
        return "reserved"  # IPv4-compatible, unassigned: nothing a service is reached at
    return None


# eq=False: hashed by identity, cheaply, as a key of `_verdict` (one object per setting value).
@dataclass(frozen=True, eq=False)
class EgressPolicy:
    """What `EGRESS_ALLOW` lists: address ranges, host names and `*.suffix` host patterns."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()

    def host_listed(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        return name in self.hosts or name.endswith(self.suffixes)

    def address_listed(self, address: IPAddress) -> bool:
        candidates = [_bare(address)]
        if (inner := embedded_v4(candidates[0])) is not None:
            candidates.append(inner)
        if any(a in METADATA for a in candidates):
            # Never by a range: only the metadata address itself, listed alone.
            return any(n.num_addresses == 1 and n[0] in candidates for n in self.networks)
        return any(a in n for a in candidates for n in self.networks if n.version == a.version)

    def check(self, host: str, address: IPAddress) -> None:
        """Raise EgressRefused unless a connection for `host` may go to `address`."""
        why = _verdict(self, host, address)
        if why is not None:
            raise EgressRefused(host, str(address), why)


@functools.lru_cache(maxsize=4096)
def _verdict(policy: EgressPolicy, host: str, address: IPAddress) -> str | None:
    """Why `policy` refuses a connection for `host` to `address` (None: it may go). A pure
    function of its arguments, kept for repeated calls: the lookup that produced
    `address` is never kept, so this cannot hide a changed DNS answer."""
    why = refusal(address)
    if why is None or policy.address_listed(address):
        return None
    if why != "metadata" and policy.host_listed(host):
        return None
    return why


def parse_allow(entries: Iterable[str]) -> EgressPolicy:
    """`EGRESS_ALLOW`'s entries as a policy; ImproperlyConfigured names a bad entry."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    suffixes: list[str] = []
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        name = entry.removeprefix("*.").rstrip(".")
        labels = name.split(".")
        if "/" in entry or not all(
            label and len(label) <= 63 and label.replace("-", "").replace("_", "").isalnum()
            for label in labels
        ):
            raise ImproperlyConfigured(
                f"EGRESS_ALLOW: {raw.strip()!r} is neither an address range (10.2.0.0/16, "
                "127.0.0.1, ::1) nor a host name (api.internal, *.corp.example)"
            )
        if entry.startswith("*."):
            suffixes.append("." + name)
        else:
            hosts.add(name)
    return EgressPolicy(tuple(networks), frozenset(hosts), tuple(suffixes))


@functools.lru_cache(maxsize=4)
def _parsed(entries: tuple[str, ...]) -> EgressPolicy:
    return parse_allow(entries)


def current_policy() -> EgressPolicy:
    """The policy of the `EGRESS_ALLOW` setting (parsed once per value, so tests may override it)."""
    allow = settings.EGRESS_ALLOW
    return _parsed(tuple(allow.split(",") if isinstance(allow, str) else allow))


def check(**_: Any) -> list[Any]:
    """`manage.py check`: an error for an `EGRESS_ALLOW` entry that means nothing."""
    from django.core.checks import Error

    try:
        current_policy()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="runtime.E002")]
    return []


@functools.lru_cache(maxsize=4096)
def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _permitted(host: str, found: Iterable[str], policy: EgressPolicy) -> list[str]:
    """The resolved addresses a connection may go to, in the resolver's order; EgressRefused
    (naming the first refused one) when none may. A refused address among allowed ones
    is skipped: the connection only ever goes to a checked address."""
    permitted: list[str] = []
    refused: EgressRefused | None = None
    for text in dict.fromkeys(found):
        try:
            policy.check(host, ipaddress.ip_address(text))
        except EgressRefused as exc:
            refused = refused or exc
            continue
        permitted.append(text)
    if refused is not None and not permitted:
        raise refused
    if not permitted:
        raise OSError(f"{host}: the resolver returned no address")
    return permitted


def addresses(host: str, port: int) -> list[str]:
    """The checked addresses to connect to for `host` (resolved here, by the system's
    resolver, which also reads numeric forms like `0x7f.1` or `2130706433`)."""
    policy = current_policy()
    literal = _literal(host)
    if literal is not None:
        policy.check(host, literal)
        return [host]
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return _permitted(host, (str(info[4][0]) for info in found), policy)


async def addresses_async(host: str, port: int) -> list[str]:
    """`addresses`, resolving without blocking the event loop."""
    policy = current_policy()
    literal = _literal(host)
    if literal is not None:
        policy.check(host, literal)
        return [host]
    found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return _permitted(host, (str(info[4][0]) for info in found), policy)


class _AsyncBackend:
    """An httpcore network backend that connects only to checked addresses (wrapping the
    library's own backend, whose exceptions its pool maps)."""

    def __init__(self, core: ModuleType) -> None:
        self._core = core
        self._inner = core.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        try:
            with anyio.fail_after(timeout):
                found = await addresses_async(host, port)
        except TimeoutError:
            raise self._core.ConnectTimeout(f"resolving {host} took too long") from None
        except OSError as exc:
            raise self._core.ConnectError(str(exc)) from exc
        last: Exception | None = None
        for address in found:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except self._core.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise EgressRefused(path, path, "unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _SyncBackend:
    """`_AsyncBackend` for the blocking clients."""

    def __init__(self, core: ModuleType) -> None:
        self._core = core
        self._inner = core.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        try:
            found = addresses(host, port)
        except OSError as exc:
            raise self._core.ConnectError(str(exc)) from exc
        last: Exception | None = None
        for address in found:
            try:
                return self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except self._core.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise EgressRefused(path, path, "unix socket")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs milliseconds; a context is safe to share between clients.
    return httpx.create_ssl_context()


@functools.cache
def _transports(x: ModuleType, core: ModuleType) -> tuple[type, type]:
    """An async and a blocking transport class for one httpx (httpx or httpx2) and its httpcore.

    What httpx's own transports do, around a pool given our backend: the request handed
    to httpcore as is (its Host header and TLS server name are the URL's host), httpcore's
    errors as httpx's (the most specific), nothing else translated.
    """
    errors = [
        (getattr(core, name), getattr(x, name))
        for name in (
            "TimeoutException",
            "ConnectTimeout",
            "ReadTimeout",
            "WriteTimeout",
            "PoolTimeout",
            "NetworkError",
            "ConnectError",
            "ReadError",
            "WriteError",
            "ProxyError",
            "UnsupportedProtocol",
            "ProtocolError",
            "LocalProtocolError",
            "RemoteProtocolError",
        )
    ]

    @contextmanager
    def mapped() -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            target = None
            for source, candidate in errors:
                if isinstance(exc, source) and (target is None or issubclass(candidate, target)):
                    target = candidate
            if target is None:
                raise
            raise target(str(exc)) from exc

    def core_request(request: Any) -> Any:
        return core.Request(
            method=request.method,
            url=core.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )

    def pool_options(limits: Any) -> dict[str, Any]:
        return {
            "ssl_context": _ssl_context(),
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
        }

    class AsyncStream(x.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            with mapped():
                async for part in self._stream:
                    yield part

        async def aclose(self) -> None:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()

    class AsyncTransport(x.AsyncBaseTransport):  # type: ignore[misc,name-defined]
        def __init__(self, limits: Any = None) -> None:
            self._pool = core.AsyncConnectionPool(
                **pool_options(limits or x.Limits()), network_backend=_AsyncBackend(core)
            )

        async def handle_async_request(self, request: Any) -> Any:
            with mapped():
                response = await self._pool.handle_async_request(core_request(request))
            return x.Response(
                status_code=response.status,
                headers=response.headers,
                stream=AsyncStream(response.stream),
                extensions=response.extensions,
            )

        async def aclose(self) -> None:
            await self._pool.aclose()

    class SyncStream(x.SyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        def __iter__(self) -> Iterator[bytes]:
            with mapped():
                yield from self._stream

        def close(self) -> None:
            if hasattr(self._stream, "close"):
                self._stream.close()

    class SyncTransport(x.BaseTransport):  # type: ignore[misc,name-defined]
        def __init__(self, limits: Any = None) -> None:
            self._pool = core.ConnectionPool(
                **pool_options(limits or x.Limits()), network_backend=_SyncBackend(core)
            )

        def handle_request(self, request: Any) -> Any:
            with mapped():
                response = self._pool.handle_request(core_request(request))
            return x.Response(
                status_code=response.status,
                headers=response.headers,
                stream=SyncStream(response.stream),
                extensions=response.extensions,
            )

        def close(self) -> None:
            self._pool.close()

    return AsyncTransport, SyncTransport


# A client given a transport never mounts the environment's proxies (a proxy would resolve
# and connect on its own, past the check); trust_env=False also leaves out ~/.netrc
# credentials. Redirects are answers, never followed.
def async_client(*, limits: httpx.Limits | None = None, **options: Any) -> httpx.AsyncClient:
    """An httpx.AsyncClient whose every connection passes the egress policy."""
    transport = _transports(httpx, httpcore)[0](limits)
    return httpx.AsyncClient(
        transport=transport, follow_redirects=False, trust_env=False, **options
    )


def client(**options: Any) -> httpx.Client:
    """An httpx.Client whose every connection passes the egress policy."""
    transport = _transports(httpx, httpcore)[1]()
    return httpx.Client(transport=transport, follow_redirects=False, trust_env=False, **options)


def mcp_async_client(**options: Any) -> Any:
    """An httpx2.AsyncClient (the MCP SDK's HTTP library) whose every connection passes the policy."""
    import httpcore2
    import httpx2

    transport = _transports(httpx2, httpcore2)[0]()
    return httpx2.AsyncClient(
        transport=transport, follow_redirects=False, trust_env=False, **options
    )
