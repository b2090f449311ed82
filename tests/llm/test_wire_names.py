"""Tool names valid for every wire format, and the way back (llm/wire_names.py)."""

import asyncio
from collections.abc import AsyncIterator

from llm.base import EndpointConfig, ModelAdapter
from llm.types import (
    ChatMessage,
    ChatRequest,
    Finish,
    StreamEvent,
    ToolCallFinished,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
)
from llm.wire_names import WIRE_NAME, WireNames, wire_name

SCHEMA = {"type": "object", "properties": {}}


def test_names_that_fit_go_out_unchanged_and_dotted_ones_are_mapped():
    assert wire_name("query_orders") == "query_orders"
    assert wire_name("parcels.track_parcel") == "parcels__track_parcel"
    long = "a" * 40 + "." + "b" * 40
    assert WIRE_NAME.match(wire_name(long)) and len(wire_name(long)) == 64
    assert wire_name(long) != wire_name(long[:-1] + "c")


def test_a_collision_with_a_real_tool_name_gets_a_hashed_name():
    names = WireNames(["parcels__track_parcel", "parcels.track_parcel"])
    sent = names.out["parcels.track_parcel"]
    assert sent != "parcels__track_parcel" and WIRE_NAME.match(sent)
    assert names.back[sent] == "parcels.track_parcel"


class _Echo(ModelAdapter):
    """Calls the first tool it is offered, under the name it received."""

    api = "test-echo"
    seen: ChatRequest | None = None

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        _Echo.seen = request
        name = request.tools[0].name
        call = ToolCallRequest(id="c1", name=name, arguments={})
        yield ToolCallStarted(index=0, id="c1", name=name)
        yield ToolCallFinished(index=0, call=call)
        yield Finish("tool_calls")


def test_the_adapter_sends_wire_names_and_returns_stored_ones():
    request = ChatRequest(
        messages=(
            ChatMessage(role="user", content="where is it?"),
            ChatMessage(
                role="assistant",
                tool_calls=(ToolCallRequest(id="c0", name="parcels.track_parcel", arguments={}),),
            ),
            ChatMessage(role="tool", content="ok", tool_call_id="c0", name="parcels.track_parcel"),
        ),
        tools=(
            ToolSpec("parcels.track_parcel", "Track.", SCHEMA),
            ToolSpec("clock", "Time.", SCHEMA),
        ),
        tool_choice="parcels.track_parcel",
    )
    response = asyncio.run(_Echo(EndpointConfig(name="e", api="test-echo")).complete(request))

    seen = _Echo.seen
    assert seen is not None
    assert [t.name for t in seen.tools] == ["parcels__track_parcel", "clock"]
    assert seen.messages[1].tool_calls[0].name == "parcels__track_parcel"
    assert seen.messages[2].name == "parcels__track_parcel"
    assert seen.tool_choice == "parcels__track_parcel"
    assert [c.name for c in response.tool_calls] == ["parcels.track_parcel"]
