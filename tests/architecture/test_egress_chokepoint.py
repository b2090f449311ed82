"""One egress policy for every outbound call (issue 43): no shipped module opens an HTTP
client, a URL or a socket of its own. Every one is made by runtime/egress.py, which
resolves the host itself, connects only to a checked address, follows no redirect and
uses no environment proxy; a client made anywhere else would skip all four."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Not shipped to a web or worker process: developer tools, the dev stack, the tests and the
# Python client (which runs in the caller's process, calling the platform).
NOT_SHIPPED = {"tests", "bench", "devstack", "clients", "docs", "examples", "deploy", ".venv"}
THE_POLICY = ROOT / "runtime" / "egress.py"
# Reviewed exceptions, each with why it keeps the policy.
REVIEWED = {
    # apply_config's reachability check connects to an address egress.addresses() checked.
    ("configuration/schema.py", "socket.create_connection"),
    # The web launcher's listening socket: inbound, nothing is connected to.
    ("agentplatform/web.py", "socket.socket"),
}

# module -> the calls that open a connection (a client, a request, a socket).
OPENERS = {
    "httpx": {"Client", "AsyncClient", "request", "stream", "get", "post", "put", "patch"},
    "httpx2": {"Client", "AsyncClient", "request", "stream", "get", "post", "put", "patch"},
    "httpcore": {"ConnectionPool", "AsyncConnectionPool"},
    "requests": {"get", "post", "put", "patch", "delete", "request", "Session"},
    "urllib.request": {"urlopen", "build_opener", "Request"},
    "aiohttp": {"ClientSession", "request"},
    "socket": {"create_connection", "socket"},
    "http.client": {"HTTPConnection", "HTTPSConnection"},
}


def _shipped_modules() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*.py")
        if not (set(path.relative_to(ROOT).parts) & NOT_SHIPPED)
        and "migrations" not in path.parts
        and path != THE_POLICY
    ]


def _openers(tree: ast.AST) -> list[str]:
    aliases: dict[str, str] = {}  # local name -> module or module.attribute
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                aliases[name.asname or name.name.split(".")[0]] = (
                    name.name if name.asname else name.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for name in node.names:
                aliases[name.asname or name.name] = f"{node.module}.{name.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, dotted = node.func, []
        while isinstance(func, ast.Attribute):
            dotted.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in aliases:
            continue
        full = ".".join([aliases[func.id], *dotted])
        module, _, attribute = full.rpartition(".")
        if attribute in OPENERS.get(module, ()):
            found.append(f"{full}() at line {node.lineno}")
    return found


def test_no_shipped_module_opens_a_connection_past_the_egress_policy() -> None:
    offenders = {
        str(path.relative_to(ROOT)): calls
        for path in _shipped_modules()
        if (
            calls := [
                call
                for call in _openers(ast.parse(path.read_text(), str(path)))
                if (str(path.relative_to(ROOT)), call.split("(")[0]) not in REVIEWED
            ]
        )
    }
    assert offenders == {}, (
        "make outbound clients with runtime.egress.client/async_client/mcp_async_client"
    )


def test_the_scan_finds_a_client_made_around_the_policy() -> None:
    # The scan itself can fail: each spelling of a stray client is seen.
    planted = ast.parse(
        "import httpx\nfrom urllib.request import urlopen\nimport socket as s\n"
        "httpx.Client(); urlopen('http://10.0.0.1'); s.create_connection(('x', 1))\n"
        "from httpx import AsyncClient\nAsyncClient()\n"
    )
    assert [c.split("(")[0] for c in _openers(planted)] == [
        "httpx.Client",
        "urllib.request.urlopen",
        "socket.create_connection",
        "httpx.AsyncClient",
    ]
