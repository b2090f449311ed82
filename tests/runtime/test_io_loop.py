"""runtime/io_loop.py: coroutines on the shared loop, and inline for those that never wait."""

import asyncio

import pytest

from runtime import io_loop


async def _add(a: int, b: int) -> int:
    return a + b


def test_run_inline_runs_a_coroutine_that_never_waits_on_this_thread() -> None:
    assert io_loop.run_inline(_add(2, 3)) == 5


def test_run_inline_refuses_a_coroutine_that_waits_and_closes_it() -> None:
    closed: list[bool] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(0)  # gives the loop a turn: suspends
        finally:
            closed.append(True)

    with pytest.raises(RuntimeError, match="suspended"):
        io_loop.run_inline(waits())
    assert closed == [True]


def test_run_waits_for_the_shared_loop() -> None:
    async def sleeps() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert io_loop.run(sleeps(), timeout=5) == "done"


def test_a_forked_child_gets_a_loop_of_its_own() -> None:
    """The child inherits the parent's loop object but not the thread running it."""
    import os

    parent_loop = io_loop.get_loop()
    assert io_loop.get_loop() is parent_loop  # handed out again, not made anew
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's teardown
        try:
            loop = io_loop.get_loop()
            ran = io_loop.run(_add(20, 22), timeout=5)
            os.write(write_end, f"{loop is not parent_loop} {ran}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        report = os.read(read_end, 100).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert report == "True 42"
    assert io_loop.get_loop() is parent_loop
