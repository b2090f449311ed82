"""bench/model_server.py: a session's later turns get the scripted tool round too."""

from bench.model_server import _after_tool


def test_a_tool_message_of_an_earlier_turn_does_not_answer_this_one() -> None:
    """`sustained` posts several turns per session: the history holds the last turn's tool
    result, and the scripted model answered the new turn at once (one model call, not two)."""
    earlier = [
        {"role": "user", "content": "what time is it? s-1"},
        {"role": "assistant", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."},
    ]
    new_turn = {"messages": [*earlier, {"role": "user", "content": "what time is it? s-1"}]}
    after_its_tool = {
        "messages": [
            *new_turn["messages"],
            {"role": "assistant", "tool_calls": [{"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c2", "content": "12:01"},
        ]
    }

    assert _after_tool(new_turn) is False
    assert _after_tool(after_its_tool) is True
    assert _after_tool({"messages": earlier[:3]}) is True


def test_calls_share_one_kept_alive_connection_and_stream_whole_answers() -> None:
    """A provider keeps the connection open; so does the bench's model, or every call of a
    turn would charge the workers a TCP connect that production does not pay."""
    import asyncio

    import httpx

    from bench.model_server import ModelServer

    async def scenario() -> tuple[int, list[str]]:
        server = ModelServer(latency=0.0, tool="bench_clock")
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "what time? s-1"}]}
        async with listener, httpx.AsyncClient() as client:
            texts = [(await client.post(url, json=body)).text for _ in range(3)]
            stats = (await client.get(f"http://127.0.0.1:{port}/stats")).json()
        assert len(stats) == 3
        return server.connections, texts

    connections, texts = asyncio.run(scenario())
    assert connections == 1
    assert all(t.rstrip().endswith("data: [DONE]") and "bench_clock" in t for t in texts)
