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
