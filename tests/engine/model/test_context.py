"""The context assembler: the budget's partitions, the trimming order, the watermarks and the
window as a hard limit. Pure functions: no database (pytest-django refuses any query here)."""

import json
import random
from typing import Any

import pytest

from engine.model.context import (
    COLLAPSED_HEADING,
    MEMORY_HEADING,
    SUMMARY_NAME,
    assemble,
    build_request,
    cap_text,
    is_small_talk,
    message_tokens,
)
from llm.types import ChatMessage
from memory.budget import budget_problems, context_budget
from memory.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    EstimateTokenizer,
    count_message_tokens,
    estimate_request_tokens,
    tokenizer_get,
)
from record.models import Agent, Message
from tests.reference_tokenizer import reference_request_tokens, reference_tokens
from tools.rendering import FAILURE_MARKER


class History:
    """Messages as the engine stores them (seq, turn, cached token counts), made in memory."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.turn = 0
        self.calls = 0

    def _add(self, **fields: Any) -> Message:
        fields.setdefault("turn", self.turn)
        extra = json.dumps(fields.get("tool_calls")) if fields.get("tool_calls") else ""
        message = Message(
            seq=len(self.messages) + 1,
            token_count=count_message_tokens(fields.get("content", ""), extra),
            **fields,
        )
        self.messages.append(message)
        return message

    def user(self, text: str) -> "History":
        self.turn += 1
        self._add(role="user", content=text)
        return self

    def answer(self, text: str) -> "History":
        self._add(role="assistant", content=text)
        return self

    def tool_round(self, name: str, result: str, *, failed: bool = False, **args: Any) -> "History":
        self.calls += 1
        call_id = f"call_{self.calls}"
        self._add(
            role="assistant",
            content="",
            tool_calls=[{"id": call_id, "name": name, "arguments": args}],
        )
        content = f"{FAILURE_MARKER} (status: failed): {result}" if failed else result
        data = {"error": result, "status": "failed"} if failed else {"result": result}
        self._add(role="tool", content=content, tool_call_id=call_id, name=name, data=data)
        return self


def agent(window: int = 2000, **fields: Any) -> Agent:
    fields.setdefault("system_prompt", "You are a support assistant.")
    return Agent(slug="a", context_window=window, tools=[], rules=[], **fields)


def texts(messages: tuple[ChatMessage, ...]) -> list[str]:
    return [m.content for m in messages]


def assert_pairs_intact(messages: tuple[ChatMessage, ...]) -> None:
    """Every assistant tool call is followed by all its results, and no result is orphaned."""
    open_ids: set[str] = set()
    for m in messages:
        if m.role == "tool":
            assert m.tool_call_id in open_ids, f"orphan result {m.tool_call_id}"
            open_ids.discard(m.tool_call_id)
            continue
        assert not open_ids, f"calls without results: {open_ids}"
        open_ids = {c.id for c in m.tool_calls}
    assert not open_ids


# The budget -------------------------------------------------------------------------


def test_the_default_partitions_are_the_seeds_128k_split_scaled():
    budget = context_budget(128000)
    assert (budget.system, budget.history, budget.memory) == (8000, 64000, 16000)
    # Real counts: a small buffer for the wire's framing; the reply got the rest.
    assert (budget.input, budget.buffer) == (36000, 4000)
    assert sum(budget.partitions().values()) == 128000
    small = context_budget(2000)
    assert (small.system, small.history, small.input, small.buffer) == (125, 1000, 562, 62)


def test_overrides_are_tokens_or_shares_and_the_window_stays_a_hard_limit():
    budget = context_budget(10000, {"history": 3000, "memory": 0.1, "trim_at": 0.5})
    assert (budget.history, budget.memory, budget.trim_at) == (3000, 1000, 0.5)
    squeezed = context_budget(10000, {"system": 9000})
    assert sum(squeezed.partitions().values()) <= 10000
    assert squeezed.system == 9000 and squeezed.history == 0


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ([], "must be an object"),
        ({"histroy": 1}, "unknown key 'histroy'"),
        ({"history": -1}, "'history' must be a number of at least 0"),
        ({"history": True}, "'history' must be a number"),
        ({"trim_at": 1.5}, "'trim_at' must be a share between 0 and 1"),
        ({"trim_at": 0.9, "summarise_at": 0.5}, "'trim_at' must not be above 'summarise_at'"),
        (
            {"summarise_ahead_at": 0.95},
            "'summarise_ahead_at' must not be above 'summarise_at'",
        ),
    ],
)
def test_bad_overrides_are_named(overrides: Any, problem: str):
    assert any(problem in p for p in budget_problems(overrides))
    assert budget_problems({"history": 32000, "memory": 0.05, "summarise_at": 0.8}) == []


# What the model sees, in order -------------------------------------------------------


def test_a_short_history_is_sent_whole_after_the_system_blocks_and_memory():
    history = History().user("Hello, my name is Ada.").answer("Hi Ada!").user("What's new?")
    assembly = assemble(
        agent=agent(),
        history=history.messages,
        tools={},
        final=False,
        memory_block="Prefers email.",
        context_blocks=["Time: 12:00 UTC", "  "],
    )
    request = assembly.request
    assert [m.role for m in request.messages] == ["system"] * 3 + ["user", "assistant", "user"]
    assert texts(request.messages)[:3] == [
        "You are a support assistant.",
        "Time: 12:00 UTC",
        f"{MEMORY_HEADING}\nPrefers email.",
    ]
    usage = assembly.usage
    assert usage["system"] == count_message_tokens("You are a support assistant.") + (
        count_message_tokens("Time: 12:00 UTC")
    )
    assert usage["memory"] == count_message_tokens(f"{MEMORY_HEADING}\nPrefers email.")
    assert usage["input"] == history.messages[-1].token_count
    assert usage["history"] == sum(m.token_count for m in history.messages[:-1])
    assert assembly.summarise == () and usage["left_out"] == 0


def test_the_memory_block_is_capped_to_its_partition():
    block = "The user likes long walks. " * 400
    request = build_request(agent=agent(), history=[], tools={}, final=False, memory_block=block)
    memory = request.messages[-1].content
    assert memory.startswith(MEMORY_HEADING) and memory.endswith("…")
    assert count_message_tokens(memory) <= context_budget(2000).memory


def test_the_final_note_comes_last_and_tools_are_withheld():
    history = History().user("Find my orders")
    request = build_request(
        agent=agent(), history=history.messages, tools={}, final=True, note="Limit reached."
    )
    assert request.messages[-1].role == "system"
    assert request.messages[-1].content.startswith("Limit reached.")
    assert request.tools == () and request.tool_choice == "none"


# Trimming order ------------------------------------------------------------------------


def _chatty(turns: int) -> History:
    history = History()
    for n in range(turns):
        history.user(f"Question {n}: where is parcel {n} of order 55{n}? " + "detail " * 12)
        history.answer(f"Parcel {n} is in the depot. " + "context " * 12)
    return history


def test_small_talk_goes_first():
    history = History().user("hi").answer("Hello! How can I help?")
    history.user("thanks!").answer("You're welcome.")
    for n in range(6):
        history.user(f"My order {n} is late, order number 77{n}. " + "more " * 10)
        history.answer(f"I see order 77{n}. " + "words " * 10)
    history.user("Anything else?")
    assembly = assemble(agent=agent(1000), history=history.messages, tools={}, final=False)
    sent = texts(assembly.request.messages)
    assert "hi" not in sent and "thanks!" not in sent and "You're welcome." not in sent
    assert any(t.startswith("My order 0 is late") for t in sent)
    assert assembly.usage["left_out"] == 4


def test_a_failed_round_that_a_later_round_corrected_goes_before_anything_key():
    history = History().user("What is the status of order 9? " + "please " * 20)
    history.tool_round("order_status", "order id must be a number", failed=True, order="nine")
    history.tool_round("order_status", "shipped on Monday", order=9)
    history.answer("Order 9 shipped on Monday. " + "words " * 30)
    for n in range(3):
        history.user(f"Tell me about order {n}. " + "please " * 20)
        history.answer(f"Order {n} is fine. " + "words " * 30)
    history.user("And now?")
    assembly = assemble(agent=agent(1100), history=history.messages, tools={}, final=False)
    sent = assembly.request.messages
    joined = " ".join(texts(sent))
    assert "must be a number" not in joined
    assert "shipped on Monday" in joined  # the correction, a result later steps depend on
    assert_pairs_intact(sent)


def test_a_finished_tool_round_collapses_to_its_conclusion():
    history = History().user("How many orders this week? " + "please " * 20)
    history.tool_round("query_orders", json.dumps({"orders": list(range(60))}), days=7)
    history.answer("You have 60 orders this week.")
    for n in range(4):
        history.user(f"Tell me about order {n}. " + "please " * 20)
        history.answer(f"Order {n} is fine. " + "words " * 20)
    history.user("Thanks, and the week before?")
    assembly = assemble(agent=agent(1000), history=history.messages, tools={}, final=False)
    sent = assembly.request.messages
    notes = [m.content for m in sent if m.content.startswith(COLLAPSED_HEADING)]
    assert notes == [f'{COLLAPSED_HEADING} query_orders {{"days": 7}} → ok']
    assert "You have 60 orders this week." in texts(sent)
    assert not any(m.tool_calls for m in sent) and not any(m.role == "tool" for m in sent)


def test_the_current_turns_rounds_stay_while_older_turns_give_way():
    history = _chatty(8).user("Find order 123")
    history.tool_round("find_order", "order 123: " + "line x " * 100, order=123)
    assembly = assemble(
        agent=agent(1200), history=history.messages, tools={}, final=False, summarise=False
    )
    sent = assembly.request.messages
    assert sent[-2].tool_calls and sent[-1].role == "tool" and sent[-3].content == "Find order 123"
    assert assembly.usage["left_out"] > 0
    assert assembly.usage["history"] <= assembly.usage["history_limit"]
    assert_pairs_intact(sent)


# Watermarks ---------------------------------------------------------------------------------


def test_under_the_trim_watermark_nothing_goes():
    history = _chatty(2).user("ok so?")
    assembly = assemble(agent=agent(4000), history=history.messages, tools={}, final=False)
    assert assembly.usage["history"] < 0.6 * assembly.usage["history_limit"]
    assert len(assembly.request.messages) == 1 + len(history.messages)


def test_past_the_summary_watermark_the_oldest_third_is_handed_back_in_whole_turns():
    history = _chatty(20).user("What about parcel 20?")
    assembly = assemble(agent=agent(2000), history=history.messages, tools={}, final=False)
    chosen = assembly.summarise
    assert chosen and chosen[0] is history.messages[0]
    assert chosen[-1].role == "assistant"  # a whole turn
    raw = assembly.usage["history_raw"]
    assert sum(m.token_count for m in chosen) * 3 >= raw * 0.9
    assert len(chosen) < len(history.messages) - 1
    # Meanwhile (or if the summary fails) the request fits by dropping the oldest.
    assert assembly.usage["history"] <= assembly.usage["history_limit"]
    assert estimate_request_tokens(assembly.request) <= 2000


def test_between_the_ahead_and_the_summary_watermarks_the_oldest_third_is_handed_back_ahead():
    """Past 60 % (after trimming) and under 90 %: the same chunk comes back as `ahead`, for a
    summary prepared in the background; nothing is to be summarised in the step yet."""
    found = None
    for turns in range(2, 20):
        history = _chatty(turns).user("And now?")
        assembly = assemble(agent=agent(2000), history=history.messages, tools={}, final=False)
        if assembly.summarise:
            break
        if assembly.ahead:
            found = (history, assembly)
            break
    assert found is not None, "no history fell between the watermarks"
    history, assembly = found
    used, limit = assembly.usage["history"], assembly.usage["history_limit"]
    assert 0.6 * limit < used <= 0.9 * limit
    assert assembly.ahead[0] is history.messages[0] and assembly.ahead[-1].role == "assistant"
    # With the ahead watermark at the summary's, nothing is prepared ahead.
    off = agent(2000, context_budget={"summarise_ahead_at": 0.9})
    assert not assemble(agent=off, history=history.messages, tools={}, final=False).ahead


def test_a_summary_stands_at_the_head_for_what_it_replaced():
    history = _chatty(6)
    history.user("Next question")
    summary = history._add(
        role="system",
        name=SUMMARY_NAME,
        content="Summary: the user's account is 4471.",
        data={"through_seq": 6, "sections": {}},
    )
    history.answer("Sure.")
    request = build_request(agent=agent(4000), history=history.messages, tools={}, final=False)
    sent = texts(request.messages)
    assert sent[1] == summary.content
    assert sent.count(summary.content) == 1
    assert not any(t.startswith(("Question 0", "Question 1", "Question 2")) for t in sent)
    assert any(t.startswith("Question 3") for t in sent)


def test_archived_messages_are_never_shown():
    history = _chatty(2)
    history.messages[0].archived_at = history.messages[1].created_at or "2026-01-01"  # type: ignore[assignment]
    request = build_request(agent=agent(4000), history=history.messages, tools={}, final=False)
    assert not any(t.startswith("Question 0") for t in texts(request.messages))


# Hard limits ---------------------------------------------------------------------------------


def test_no_request_exceeds_the_window_and_no_call_loses_its_results():
    rng = random.Random(7)
    for case in range(150):
        history = History()
        for _ in range(rng.randint(1, 30)):
            history.user(("what about " + "thing " * rng.randint(1, 60)).strip())
            for _ in range(rng.randint(0, 3)):
                history.tool_round(
                    rng.choice(["a", "b"]),
                    "r" * rng.randint(1, 900),
                    failed=rng.random() < 0.3,
                    n=rng.randint(0, 9),
                )
            if rng.random() < 0.8:
                history.answer("done " * rng.randint(1, 50))
        window = rng.choice([1500, 2000, 4000, 8000])
        request = build_request(
            agent=agent(window),
            history=history.messages,
            tools={},
            final=rng.random() < 0.2,
            memory_block="m " * rng.randint(0, 3000),
            context_blocks=["env " * rng.randint(0, 30)],
        )
        assert estimate_request_tokens(request) <= window, case
        assert_pairs_intact(request.messages)
        assert [m for m in request.messages if m.role != "system"][0].role == "user", case
        assert request.messages[-1 if request.tool_choice != "none" else -2].role in (
            "user",
            "tool",
            "assistant",
        )


def test_the_endpoint_window_caps_the_agents():
    history = _chatty(20).user("and?")
    request = build_request(
        agent=agent(128000), history=history.messages, tools={}, final=False, window=1500
    )
    assert estimate_request_tokens(request) <= 1500


# Helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "small"),
    [
        ("hi", True),
        ("Thanks a lot!", True),
        ("ok", True),
        ("谢谢", True),
        ("hi, my order 5 is late", False),
        ("yes", False),
        ("", False),
    ],
)
def test_small_talk(text: str, small: bool):
    assert is_small_talk(text) is small


def test_cap_text_fits_the_tokens():
    assert cap_text("short", 10) == "short"
    cut = cap_text("word " * 100, 10)
    assert cut.endswith("…") and len(cut) < 60
    assert cap_text("你好" * 50, 10).endswith("…")
    assert cap_text("anything", 0) == ""


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("limit", [1, 7, 30, 101])
def test_cap_text_fits_the_tokens_an_independent_tokenizer_counts(name: str, limit: int):
    # BPE is not monotone over prefixes: every cut kept must still be checked.
    for text in (_orders_json(3, random.Random(limit)), "您好，订单SO-1还没到，物流在海关。" * 20):
        cut = cap_text(text, limit, tokenizer_get(name))
        assert reference_tokens(cut, name) <= limit
        assert cut in (text, "") or cut.endswith("…")


# The window, counted by an independent tokenizer ------------------------------------------


def _orders_json(count: int, rng: random.Random) -> str:
    """A tool result as order systems return them: ids, amounts, timestamps, digits."""
    return json.dumps(
        {
            "orders": [
                {
                    "id": f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-4{rng.getrandbits(12):03x}"
                    f"-a{rng.getrandbits(12):03x}-{rng.getrandbits(48):012x}",
                    "number": f"SO-{rng.randint(10**7, 10**8 - 1)}",
                    "amount": round(rng.uniform(1, 99999), 2),
                    "placed_at": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
                    f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
                    "sku": [rng.randint(100000, 999999) for _ in range(3)],
                }
                for _ in range(count)
            ]
        }
    )


def _json_history(turns: int) -> History:
    rng = random.Random(34)
    history = History()
    for n in range(turns):
        history.user(f"List the orders of customer {rng.randint(1000, 9999)} since {n + 1} May.")
        history.tool_round("list_orders", _orders_json(rng.randint(2, 6), rng), customer=n)
        history.answer(f"Customer {n} has these orders: " + _orders_json(1, rng))
    return history


def _chinese_history(turns: int) -> History:
    rng = random.Random(10)
    history = History()
    for n in range(turns):
        history.user(
            f"您好，我的订单 SO-{rng.randint(10**5, 10**6)} 还没有到，物流显示在海关被扣留了，请帮我查一下。"
        )
        result = json.dumps(
            {"状态": "海关扣留", "原因": "申报信息不完整，需要补充发票和身份证明", "单号": n},
            ensure_ascii=False,
        )
        history.tool_round("查询物流", result, 单号=n)
        history.answer(
            "您的包裹因申报信息不完整被海关扣留，请补充发票和身份证明，我们会尽快处理。" * 2
        )
    return history


def _requests(make: Any, window: int, counter: Any, budget: dict[str, Any] | None = None):
    """Each step's request as the history grows, turn by turn."""
    history = make(40).messages
    a = agent(window, context_budget=budget or {})
    for end, message in enumerate(history):
        if message.role == "user" or message.role == "tool":
            yield assemble(
                agent=a,
                history=history[: end + 1],
                tools={},
                final=False,
                summarise=False,
                tokenizer=counter,
            )


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("make", [_json_history, _chinese_history])
@pytest.mark.parametrize("window", [2000, 6000])
def test_no_request_exceeds_the_window_as_an_independent_tokenizer_counts(
    name: str, make: Any, window: int
):
    """Counted by tiktoken (tests/reference_tokenizer.py, OpenAI's recipe for chat framing):
    every step's request fits the window, and the buffer covers what the counts leave out."""
    steps = 0
    for assembly in _requests(make, window, tokenizer_get(name)):
        usage = assembly.usage
        real = reference_request_tokens(assembly.request, name)
        counted = usage["system"] + usage["memory"] + usage["history"] + usage["input"]
        assert real <= counted + usage["buffer"], (real, usage)
        assert real <= window
        steps += 1
    assert steps == 80


def test_the_old_estimate_overran_its_buffer_on_json_histories():
    """The break the real counts fix: with the estimate (4 characters a token) and its
    18.75 % buffer, a JSON history's requests took more than was counted plus the buffer:
    the overrun ate the reply's room, one step from a provider's 400."""
    old = {"input": 16 / 128, "buffer": 24 / 128}
    overruns = []
    for assembly in _requests(_json_history, 2000, EstimateTokenizer(4.0), old):
        usage = assembly.usage
        counted = usage["system"] + usage["memory"] + usage["history"] + usage["input"]
        real = reference_request_tokens(assembly.request, "o200k_base")
        overruns.append(real - counted - usage["buffer"])
    assert max(overruns) > 0


def test_a_message_is_counted_again_for_another_tokenizer():
    stored = Message(
        pk=7, role="user", content="您好，我的订单还没有到，物流显示在海关被扣留了。" * 5
    )
    default = count_message_tokens(stored.content)
    stored.token_count, stored.token_counter = default, "o200k_base"
    cl100k = tokenizer_get("cl100k_base")
    assert message_tokens(stored) == default
    assert message_tokens(stored, cl100k) == MESSAGE_OVERHEAD_TOKENS + reference_tokens(
        stored.content, "cl100k_base"
    )
    assert message_tokens(stored, cl100k) != default
    assert (stored.token_count, stored.token_counter) == (default, "o200k_base")


def test_a_count_the_old_estimate_made_is_not_reused():
    legacy = Message(pk=8, role="tool", content=_orders_json(4, random.Random(2)))
    legacy.token_count, legacy.token_counter = 90, "estimate:4"
    assert message_tokens(legacy) == MESSAGE_OVERHEAD_TOKENS + reference_tokens(
        legacy.content, "o200k_base"
    )
    assert message_tokens(legacy, EstimateTokenizer(4.0)) == 90


def test_dropped_turns_go_whole_so_the_history_starts_with_a_user_message():
    history = _chatty(30).user("and?")
    request = build_request(agent=agent(1500), history=history.messages, tools={}, final=False)
    shown = [m for m in request.messages if m.role != "system"]
    assert shown[0].role == "user" and len(shown) < len(history.messages)


def test_no_summary_is_asked_for_when_the_system_prompt_leaves_no_room_for_history():
    history = _chatty(10).user("and?")
    assembly = assemble(
        agent=agent(1000, system_prompt="rule " * 2000),
        history=history.messages,
        tools={},
        final=False,
    )
    assert assembly.usage["history_limit"] == 0 and assembly.summarise == ()
