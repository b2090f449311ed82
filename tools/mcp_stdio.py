"""stdio MCP servers: their stderr to our log, and one session per server per process.

The SDK hands a stdio server `sys.stderr` unless told otherwise; under Celery
that is a logging proxy with no file descriptor, and the process cannot start.
Every server started here gets a pipe instead, read by a thread that logs its
lines (logger `tools.mcp`, INFO: `mcp server NAME: <line>`), so a server that
fails says why in the worker's log. The pipe's end (every holder of its write
side exited) is also how a server that died is noticed.

Starting a server costs a process start (a Python server imports the SDK:
seconds), so calls share one session per server and process: started on the
first call, kept by a task of its own on the running loop (in a worker the
shared io loop, runtime/io_loop.py, where every worker thread's calls run, so
concurrent calls are plain concurrent requests on the session), and

1. restarted when its process exits: the call that was waiting on it reports
   the server unreachable (as before); the next call starts it again;
2. restarted after a call timed out while the server had answered nothing for
   a whole timeout (hung, not merely slow);
3. closed at interpreter exit; a forked child forgets its parent's sessions
   (they are the parent's to close) and starts its own.

Discovery (tools/list for apply_config and refreshes) still starts a process
of its own each time, so a refresh always sees what the server lists now.

A process starts only from an executable on MCP_STDIO_COMMANDS, with the environment
its entry declares over a base holding no secret (tools/stdio_policy.py); in a worker,
or apply_config's process, never in a web process (the admin queues a refresh).
"""

import asyncio
import atexit
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import TYPE_CHECKING, TextIO, cast

from .stdio_policy import child_env, command_problem, env_problems

if TYPE_CHECKING:
    from mcp import Client

    from .mcp import McpEndpoint

logger = logging.getLogger("tools.mcp")

# One stderr line in the log at most this long: a server's output is not ours to store whole.
STDERR_LINE_MAX_CHARS = 2000
# At exit, how long closing every session may take (the SDK's own escalation: stdin closed,
# 2 s, SIGTERM, 2 s, SIGKILL).
CLOSE_ALL_TIMEOUT_S = 8.0

# The server's name, its command and its declared environment (as JSON): an edit of either
# starts a new process.
Key = tuple[str, tuple[str, ...], str]


class StdioRefused(PermissionError):
    """The command is not on MCP_STDIO_COMMANDS, or its environment reads a refused variable."""


def _drain(read_fd: int, name: str, on_exit: Callable[[], None] | None) -> None:
    """Log the server's stderr line by line until every writer has closed it, then `on_exit()`."""
    with os.fdopen(read_fd, "rb") as pipe:
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                logger.info("mcp server %s: %s", name, line[:STDERR_LINE_MAX_CHARS])
    if on_exit is not None:
        on_exit()


def stderr_pipe(name: str, on_exit: Callable[[], None] | None = None) -> TextIO:
    """A real file for the child's stderr (the write end); a daemon thread logs what arrives.

    The caller closes it once the process has started: the child holds its own copy.
    """
    read_fd, write_fd = os.pipe()
    threading.Thread(
        target=_drain, args=(read_fd, name, on_exit), name=f"mcp-stderr-{name}", daemon=True
    ).start()
    return cast(TextIO, os.fdopen(write_fd, "w"))


@asynccontextmanager
async def connected(
    endpoint: "McpEndpoint", on_exit: Callable[[], None] | None = None
) -> AsyncIterator["Client"]:
    """A session on a process started now; the process ends with the context."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    # Refused here too: a row written around the admin and apply_config starts nothing else.
    problem = command_problem(list(endpoint.command))
    problems = [problem] if problem else env_problems(endpoint.env)
    if problems:
        raise StdioRefused(f"mcp server {endpoint.name}: " + "; ".join(problems))
    # The child's environment is exactly what its entry declares over a base without secrets.
    params = StdioServerParameters(
        command=endpoint.command[0], args=list(endpoint.command[1:]), env=child_env(endpoint.env)
    )
    errlog = stderr_pipe(endpoint.name, on_exit)
    async with AsyncExitStack() as stack:
        try:
            client = await stack.enter_async_context(
                Client(stdio_client(params, errlog=errlog), cache=None)
            )
        finally:
            # Started (the child has its copy) or failed: either way ours is no longer
            # needed, and holding it would keep the drain from ever seeing the end.
            errlog.close()
        yield client


class Shared:
    """One server process and its session, kept open by a task of its own on one loop."""

    def __init__(self, endpoint: "McpEndpoint", key: Key) -> None:
        self.endpoint = endpoint
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[Client] = self.loop.create_future()
        # A start that failed after its callers gave up must not warn "never retrieved".
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.closing = asyncio.Event()
        self.usable = True
        self.started = False
        self.last_answer = self.loop.time()
        self.task = self.loop.create_task(self._own(), name=f"mcp-session-{endpoint.name}")

    async def _own(self) -> None:
        try:
            async with connected(self.endpoint, on_exit=self._exited_soon) as client:
                self.last_answer = self.loop.time()
                self.started = True
                self.ready.set_result(client)
                await self.closing.wait()
        except asyncio.CancelledError:
            if not self.ready.done():
                self.ready.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the callers waiting on `ready` get it
            if not self.ready.done():
                self.ready.set_exception(exc)
            else:
                logger.debug("mcp server %s: session ended: %r", self.endpoint.name, exc)
        finally:
            self.close()

    def _exited_soon(self) -> None:
        """From the stderr thread: the process is gone; close the session on its loop."""
        # A closed loop raises RuntimeError: nothing is left to close then.
        with suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._exited)

    def _exited(self) -> None:
        if self.usable and self.started:
            logger.warning(
                "mcp server %s (%s) exited; its next call starts it again",
                self.endpoint.name,
                self.endpoint.where,
            )
        self.close()

    def close(self) -> None:
        """No new calls; the owning task stops the process (calls still waiting end with it)."""
        self.usable = False
        self.closing.set()
        pool = _pools.get(self.loop)
        if pool is not None and pool.get(self.key) is self:
            del pool[self.key]
            if not pool:
                del _pools[self.loop]

    def answered(self) -> None:
        self.last_answer = self.loop.time()


# Per event loop (a session belongs to the loop that started it), per server: the live sessions.
_pools: dict[asyncio.AbstractEventLoop, dict[Key, Shared]] = {}


def _key(endpoint: "McpEndpoint") -> Key:
    return (endpoint.name, endpoint.command, json.dumps(endpoint.env, sort_keys=True))


@asynccontextmanager
async def shared_session(
    endpoint: "McpEndpoint", answered: tuple[type[BaseException], ...] = ()
) -> AsyncIterator["Client"]:
    """This process's session with the server, started if there is none (or it died).

    An exception in `answered` means the server did answer (a tool's own error); any
    other failure closes the session, so the next call starts a new process.
    """
    loop = asyncio.get_running_loop()
    key = _key(endpoint)
    pool = _pools.get(loop, {})
    shared = pool.get(key)
    if shared is None or not shared.usable:
        # The server's command or environment changed since (its row was edited): the old
        # process goes.
        for other in [s for k, s in pool.items() if k[0] == endpoint.name and k != key]:
            other.close()
        # Looked up again: closing the last session drops its loop's pool.
        shared = _pools.setdefault(loop, {})[key] = Shared(endpoint, key)
    # Shielded: a caller that times out while the process starts leaves the start running
    # for the next call.
    client = await asyncio.shield(shared.ready)
    asked = loop.time()
    try:
        yield client
    except answered:
        shared.answered()
        raise
    except asyncio.CancelledError:
        # Timed out (or the run was stopped). Slow is fine; silent for a whole timeout is hung.
        if loop.time() - max(shared.last_answer, asked) >= endpoint.timeout_s:
            shared.close()
        raise
    except BaseException:
        shared.close()
        raise
    shared.answered()


async def close_all() -> None:
    """Close every session of the running loop and wait for their processes to end."""
    pool = _pools.pop(asyncio.get_running_loop(), {})
    for shared in pool.values():
        shared.usable = False
        shared.closing.set()
    tasks = [shared.task for shared in pool.values()]
    if tasks:
        await asyncio.wait(tasks, timeout=CLOSE_ALL_TIMEOUT_S)


def _close_at_exit() -> None:
    for loop in list(_pools):
        if loop.is_closed() or not loop.is_running():
            continue
        future = asyncio.run_coroutine_threadsafe(close_all(), loop)
        try:
            future.result(CLOSE_ALL_TIMEOUT_S + 1)
        except Exception:  # noqa: BLE001 - exiting anyway; the servers see their stdin close
            logger.warning("mcp servers: not every session closed at exit", exc_info=True)


def _forget_after_fork() -> None:
    # The parent's processes, pipes and loop thread are the parent's; the child starts its own.
    _pools.clear()


atexit.register(_close_at_exit)
os.register_at_fork(after_in_child=_forget_after_fork)
