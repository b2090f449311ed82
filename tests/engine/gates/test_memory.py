"""Long-term memory in the engine: the remember/recall tools, the block before a turn,
and what a finished turn keeps; semantics from a fake embeddings server on 127.0.0.1."""

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from billing.models import CreditAccount, CreditLedger, UsageDaily
from billing.services import credits_grant
from engine import session_run
from memory.models import EmbeddingEndpoint, MemoryItem
from memory.services import memory_remember
from record.models import Message, ModelCall, ModelEndpoint, Session, ToolCall
from sessions.services import memory_turn_keep, message_post
from tests.factories import AgentFactory, ModelEndpointFactory, SessionFactory, UserFactory
from tests.fakes.embedding_server import FakeEmbeddingServer
from tests.fakes.fixtures import fake_servers, openai_server, unique  # noqa: F401
from tests.fakes.model_servers import Call, FakeModelServer, Reply
from tests.memory.conftest import CONCEPTS, DIMENSION

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, int]]:
    """The test drives the run itself; the end-of-turn memory task is recorded, not sent."""
    monkeypatch.setattr("record.dispatch.run_enqueue_on_commit", lambda *args: None)
    sent: list[tuple[object, int]] = []
    monkeypatch.setattr(
        "engine.phases.model.memory_enqueue_on_commit",
        lambda session_id, turn: sent.append((session_id, turn)),
    )
    return sent


@pytest.fixture
def embeddings(db) -> Iterator[FakeEmbeddingServer]:  # type: ignore[no-untyped-def]
    with FakeEmbeddingServer(dimension=DIMENSION, concepts=CONCEPTS) as server:
        EmbeddingEndpoint.objects.create(
            name="fake", base_url=server.base_url, model="fake-embed", dimension=DIMENSION
        )
        yield server


def _rules_session(rules: list[dict], owner=None, **agent_fields) -> Session:  # type: ignore[no-untyped-def]
    model = ModelEndpointFactory(name=f"rules-{uuid.uuid4().hex[:6]}", api="rules", options={})
    agent = AgentFactory(
        slug=f"mem-{uuid.uuid4().hex[:8]}", model=model, rules=rules, **agent_fields
    )
    made: Session = SessionFactory(agent=agent, owner=owner or UserFactory())
    return made


def _turn(session: Session, content: str) -> Session:
    message_post(session=session, content=content)
    result = session_run(session_id=session.pk)
    assert result.stopped == "idle", result
    return Session.objects.get(pk=session.pk)


REMEMBER_RULES = [
    {"when": {"user": "^note", "last_tool": None},
     "tool_calls": [{"tool": "remember", "args": {
         "content": "My favourite colour is blue", "tag": "preference"}}]},
    {"when": {"last_tool": "remember"}, "answer": "Noted ({{ result.action }})"},
    {"answer": "ok"},
]  # fmt: skip


def test_remember_is_a_recorded_tool_call_that_stores_for_the_owner(embeddings):
    session = _rules_session(REMEMBER_RULES, tools=["remember"])
    session = _turn(session, "note my colour")
    assert session.state == "finished"
    call = ToolCall.objects.get(session=session)
    assert (call.tool_name, call.status) == ("remember", "success")
    assert call.output["stored"] is True and call.output["action"] == "created"
    item = MemoryItem.objects.get(owner=session.owner)
    assert (item.content, item.tag, item.subject) == (
        "My favourite colour is blue", "preference", "favourite colour"
    )  # fmt: skip
    assert item.source_session_id == session.pk
    assert item.source_key == f"call:{call.idempotency_key}"
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "Noted (created)"


def test_the_next_session_sees_the_latest_value_in_its_context(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch,
):
    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="My favourite colour is blue", tag="preference")
    memory_remember(owner_id=owner.pk, content="My favourite colour is red")
    memory_remember(owner_id=UserFactory().pk, content="My favourite colour is green")
    monkeypatch.setenv("MEMORY_MODEL_KEY", "sk-memory-0123456789")
    endpoint = ModelEndpointFactory(
        name=f"fake-openai-{unique}", api="openai", base_url=openai_server.base_url,
        model="fake-model-1", api_key_env="MEMORY_MODEL_KEY",
    )  # fmt: skip
    agent = AgentFactory(
        slug=f"mem-{unique}", model=endpoint, system_prompt="Be brief.", tools=["recall"],
        memory={"top_k": 3},
    )  # fmt: skip
    session = SessionFactory(agent=agent, owner=owner)
    openai_server.script(
        Reply(calls=[Call("recall", {"query": "colour"}, id="call_r1")]), Reply(text="Red.")
    )
    blocks = []
    import engine.run_cache as cache

    real = cache.turn_memory_block
    monkeypatch.setattr(cache, "turn_memory_block", lambda *a: blocks.append(1) or real(*a))
    session = _turn(session, "Which colour should the logo be?")
    assert session.state == "finished"
    first, second = openai_server.requests
    for request in (first, second):
        system = [m["content"] for m in request.messages if m["role"] == "system"]
        assert system[0] == "Be brief."
        # After the prompt: the context layers (environment), then the memory block.
        memory = [s for s in system if "latest:" in s]
        assert len(memory) == 1
        today = timezone.now().strftime("%Y-%m-%d")
        assert (
            f"latest: My favourite colour is red (before: My favourite colour is blue, {today})"
            in memory[0]
        )
        assert "green" not in " ".join(system)  # another owner's memory never appears
    assert len(blocks) == 1  # computed once for the turn, not per step
    # The items the block placed are marked used (the model phase writes what the gate
    # returned); another owner's are not.
    used = dict(MemoryItem.objects.values_list("content", "last_used_at"))
    assert used["My favourite colour is red"] is not None
    assert used["My favourite colour is green"] is None
    recalled = ToolCall.objects.get(session=session).output
    assert [m["content"] for m in recalled["memories"]] == ["My favourite colour is red"]
    assert [b["content"] for b in recalled["memories"][0]["before"]] == [
        "My favourite colour is blue"
    ]


RECALL_RULES = [
    {"when": {"user": "start", "last_tool": None},
     "tool_calls": [{"tool": "recall", "args": {"query": "what did I say at the start about the shipment"}}]},
    {"when": {"last_tool": "recall"}, "answer": "Found it"},
    {"answer": "ok"},
]  # fmt: skip


def test_recall_finds_archived_messages_of_this_session_only(embeddings):
    owner = UserFactory()
    session = _rules_session(RECALL_RULES, owner=owner, tools=["recall"])
    session = _turn(session, "My order 12345 is a shipment to Paris")
    _turn(session, "And I like tea")
    other = _rules_session(RECALL_RULES, owner=owner, tools=["recall"])
    _turn(other, "My other shipment goes to Berlin")
    # The summariser archived the early messages (its own work; set directly here).
    Message.objects.filter(session__in=[session, other]).update(archived_at=timezone.now())

    session = _turn(session, "what did I say at the start?")
    output = ToolCall.objects.get(session=session, tool_name="recall").output
    contents = [m["content"] for m in output["archived_messages"]]
    assert contents[0] == "My order 12345 is a shipment to Paris"
    assert not any("Berlin" in c for c in contents)  # another session's archive stays out
    assert (
        Message.objects.filter(
            session=session, archived_at__isnull=False, embedding__isnull=True
        ).count()
        == 0
    )
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "Found it"


def test_recall_without_a_reachable_endpoint_is_a_failed_call_not_a_failed_turn(db):
    EmbeddingEndpoint.objects.create(
        name="down", base_url="http://127.0.0.1:9/v1", model="m", dimension=8, timeout_s=1
    )
    session = _rules_session(RECALL_RULES, tools=["recall"])
    session = _turn(session, "what did I say at the start?")
    call = ToolCall.objects.get(session=session)
    assert call.status == "failed" and "embeddings" in call.error
    assert session.state == "finished"


def test_a_finished_turn_keeps_what_the_user_asked_and_what_extraction_found(
    embeddings, _no_worker
):
    session = _rules_session([{"answer": "Sure."}], memory={"extraction": True})
    session = _turn(
        session, "Please remember that my favourite colour is blue. I prefer email over phone."
    )
    assert _no_worker == [(session.pk, 1)]
    assert memory_turn_keep(session_id=session.pk, turn=1) == 2
    items = dict(MemoryItem.objects.filter(owner=session.owner).values_list("content", "source"))
    assert items == {
        "my favourite colour is blue": "user",
        "I prefer email over phone.": "extraction",
    }
    memory_turn_keep(session_id=session.pk, turn=1)  # a task run twice writes nothing twice
    assert MemoryItem.objects.filter(owner=session.owner).count() == 2


def test_an_evaluations_replay_keeps_nothing(embeddings, _no_worker):
    """A replay's turn (evaluations/) is not the user's: what it said is not remembered."""
    session = _rules_session([{"answer": "Sure."}])
    session = _turn(session, "Please remember that my favourite colour is blue.")
    Session.objects.filter(pk=session.pk).update(evaluation_id=1)
    assert memory_turn_keep(session_id=session.pk, turn=1) == 0
    assert not MemoryItem.objects.exists()
    Session.objects.filter(pk=session.pk).update(evaluation_id=None)
    assert memory_turn_keep(session_id=session.pk, turn=1) == 1  # the same turn, not a replay


def test_no_task_when_there_is_nothing_to_keep(embeddings, _no_worker):
    session = _rules_session([{"answer": "Sure."}])  # extraction off by default
    _turn(session, "I prefer email over phone.")
    assert _no_worker == []


EXTRACTED = Reply(
    text='{"memories": [{"action": "add", "target": null, "content": "Prefers email over phone",'
    ' "subject": "contact channel", "tag": "preference", "importance": 0.7}]}',
    usage=(300, 40),
)


def _paid_extraction_session(server: FakeModelServer, suffix: str, monkeypatch, points: int):  # type: ignore[no-untyped-def]
    """A turn answered by the free rules model; its extraction by a cheap model on the fake
    OpenAI server costing one point per token, for an owner granted `points`."""
    monkeypatch.setenv("MEMORY_MODEL_KEY", "sk-memory-0123456789")
    cheap = ModelEndpointFactory(
        name=f"cheap-{suffix}", api="openai", base_url=server.base_url, model="fake-model-1",
        api_key_env="MEMORY_MODEL_KEY", credits_per_1k_tokens=Decimal(1000),
        price_input_per_1k=Decimal("0.001"), price_output_per_1k=Decimal("0.002"),
    )  # fmt: skip
    owner = UserFactory()
    credits_grant(owner_id=owner.pk, points=points, actor="test")
    session = _rules_session(
        [{"answer": "Sure."}], owner=owner, cheap_model=cheap, memory={"extraction": True}
    )
    return _turn(session, "I prefer email over phone.")


def _books(owner_id: int) -> CreditAccount:
    account = CreditAccount.objects.get(owner_id=owner_id)
    ledger = CreditLedger.objects.filter(account=account).aggregate(s=Sum("delta"))["s"]
    assert ledger == account.balance  # the ledger explains the balance
    return account


def test_the_extraction_call_is_recorded_rolled_up_and_charged_once(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch,
):
    session = _paid_extraction_session(openai_server, unique, monkeypatch, points=2000)
    usage_before = UsageDaily.objects.get(owner=session.owner)
    openai_server.script(EXTRACTED)

    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    item = MemoryItem.objects.get(owner=session.owner)
    assert (item.content, item.subject) == ("Prefers email over phone", "contact channel")
    call = ModelCall.objects.get(session=session, purpose="extraction")
    assert (call.turn, call.input_tokens, call.output_tokens, call.outcome) == (
        1, 300, 40, "success"
    )  # fmt: skip
    assert call.cost == Decimal("0.000380")
    charge = CreditLedger.objects.get(kind="charge")
    assert (charge.points, charge.session_id) == (340, session.pk)
    assert charge.idempotency_key == f"extraction:turn1:{session.pk}:0:0"
    assert _books(session.owner_id).balance == 2000 - 340
    usage = UsageDaily.objects.get(owner=session.owner)
    assert usage.model_calls == usage_before.model_calls + 1
    assert usage.input_tokens == usage_before.input_tokens + 300
    assert usage.credits_spent == usage_before.credits_spent + 340
    after = Session.objects.get(pk=session.pk)
    assert after.cost == session.cost + call.cost
    assert after.input_tokens == session.input_tokens + 300

    # The task run again: no second call, nothing charged or counted twice.
    memory_turn_keep(session_id=session.pk, turn=1)
    assert len(openai_server.requests) == 1
    assert CreditLedger.objects.filter(kind="charge").count() == 1
    assert UsageDaily.objects.get(owner=session.owner).model_calls == usage.model_calls
    assert _books(session.owner_id).balance == 2000 - 340


def test_an_extraction_the_credits_cannot_cover_is_skipped(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch,
):
    # The estimate (the transcript plus 600 output tokens) is far above 100 points.
    session = _paid_extraction_session(openai_server, unique, monkeypatch, points=100)
    openai_server.script(EXTRACTED)

    # No call: the free rules extract and decide instead.
    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    assert openai_server.requests == []
    assert not ModelCall.objects.filter(purpose="extraction").exists()
    item = MemoryItem.objects.get(owner=session.owner)
    assert (item.content, item.versions.get().decided_by) == (
        "I prefer email over phone.", "rules"
    )  # fmt: skip
    assert _books(session.owner_id).balance == 100


def test_a_disabled_cheap_model_is_never_called_for_the_extraction(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch,
):
    session = _paid_extraction_session(openai_server, unique, monkeypatch, points=2000)
    ModelEndpoint.objects.filter(pk=session.agent.cheap_model_id).update(enabled=False)
    openai_server.script(EXTRACTED)

    # The agent's own (offline rules) model reads the turn instead: no request, no charge.
    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    assert openai_server.requests == []
    assert not ModelCall.objects.filter(purpose="extraction").exists()
    assert _books(session.owner_id).balance == 2000


# --- The cheap model decides add / update / delete / keep --------------------------


def _decided_session(server: FakeModelServer, suffix: str, owner=None, **agent_fields) -> Session:  # type: ignore[no-untyped-def]
    """An agent with memory (it lists `remember`): its turns answered by the rules model,
    its end-of-turn extraction by a cheap model on the fake OpenAI server (free)."""
    cheap = ModelEndpointFactory(
        name=f"cheap-{suffix}", api="openai", base_url=server.base_url, model="fake-model-1"
    )
    return _rules_session(
        [{"answer": "Sure."}], owner=owner, cheap_model=cheap, tools=["remember"], **agent_fields
    )


def _answer(*entries: dict) -> Reply:  # type: ignore[type-arg]
    return Reply(text=json.dumps({"memories": list(entries)}), usage=(200, 30))


def test_the_cheap_model_updates_a_kept_memory_and_its_history_is_kept(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    _no_worker,
):
    owner = UserFactory()
    blue = memory_remember(owner_id=owner.pk, content="Favourite colour: blue").item
    stranger = memory_remember(owner_id=UserFactory().pk, content="My favourite colour is green")
    session = _decided_session(openai_server, unique, owner=owner)  # extraction on by default
    session = _turn(session, "Actually these days I'd pick red over anything.")
    assert _no_worker == [(session.pk, 1)]  # the task is enqueued after the turn's commit
    openai_server.script(
        _answer({"action": "update", "target": blue.pk, "content": "Favourite colour: red",
                 "subject": "favourite colour", "tag": "preference"})
    )  # fmt: skip

    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    [request] = openai_server.requests  # one cheap call for the turn
    shown = request.messages[-1]["content"]
    assert f'"id": {blue.pk}' in shown and "red over anything" in shown
    assert "green" not in shown  # another owner's memory is never shown to the decider
    schema = request.body["response_format"]["json_schema"]
    assert schema["name"] == "memory_updates" and "memories" in schema["schema"]["properties"]
    blue.refresh_from_db()
    assert (blue.content, blue.subject, blue.superseded_at) == (
        "Favourite colour: red", "favourite colour", None
    )  # fmt: skip
    first, second = blue.versions.order_by("id")
    assert (first.content, second.content) == ("Favourite colour: blue", "Favourite colour: red")
    assert (second.actor, second.decided_by, second.source_session_id) == (
        "extraction", f"model:cheap-{unique}", session.pk
    )  # fmt: skip
    assert MemoryItem.objects.get(pk=stranger.item.pk).content == "My favourite colour is green"

    # The task run again: no second call, nothing applied twice.
    memory_turn_keep(session_id=session.pk, turn=1)
    assert len(openai_server.requests) == 1 and blue.versions.count() == 2


def test_the_cheap_model_deletes_and_keeps(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
):
    owner = UserFactory()
    dog = memory_remember(owner_id=owner.pk, content="My dog is called Rex").item
    tea = memory_remember(owner_id=owner.pk, content="I like tea").item
    session = _turn(_decided_session(openai_server, unique, owner=owner), "Rex died last year.")
    openai_server.script(
        _answer(
            {"action": "delete", "target": dog.pk, "content": "", "subject": "dog"},
            {"action": "keep", "target": tea.pk, "content": "I like tea", "subject": ""},
        )
    )
    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    dog.refresh_from_db()
    assert dog.superseded_at is not None and dog.superseded_by_id is None
    assert [v.action for v in dog.versions.order_by("id")] == ["created", "deleted"]
    assert MemoryItem.objects.get(pk=tea.pk).superseded_at is None
    # A deleted item is never shown as live.
    other = _decided_session(openai_server, unique + "b", owner=owner)
    openai_server.script(_answer())
    assert "Rex" not in turn_memory_block_for(other, "what is my dog called?")


def turn_memory_block_for(session: Session, text: str) -> str:
    from engine.gates.memory import turn_memory_block

    message_post(session=session, content=text)
    history = list(Message.objects.filter(session=session))
    return turn_memory_block(Session.objects.get(pk=session.pk), session.agent, history).text


@pytest.mark.parametrize(
    "answer",
    [
        Reply(text="I would update the colour to red.", usage=(10, 5)),  # not JSON
        Reply(text='{"items": [{"content": "red"}]}', usage=(10, 5)),  # not the schema
        "another owner's item",  # a target the model was not shown
        Reply(status=500, error_message="boom"),  # no answer at all
    ],
)
def test_an_invalid_answer_falls_back_to_the_rules(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    answer,
):
    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="I prefer tea")
    stranger = memory_remember(owner_id=UserFactory().pk, content="I prefer milk").item
    if answer == "another owner's item":
        answer = _answer({"action": "delete", "target": stranger.pk, "content": "", "subject": ""})
    session = _turn(_decided_session(openai_server, unique, owner=owner), "I prefer coffee.")
    openai_server.script(answer)

    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    # The rules: the same statement with a new value updates it, the old kept as history.
    [item] = MemoryItem.objects.filter(owner=owner)
    assert (item.content, item.superseded_at) == ("I prefer coffee.", None)
    last = item.versions.order_by("id").last()
    assert (last.action, last.decided_by, last.reason) == (
        "updated", "rules", "the same statement, a new value"
    )  # fmt: skip
    stranger.refresh_from_db()
    assert stranger.superseded_at is None and stranger.versions.count() == 1  # untouched


def test_extraction_is_on_only_for_agents_with_memory(embeddings, _no_worker):
    plain = _rules_session([{"answer": "Sure."}])
    _turn(plain, "I prefer email over phone.")
    assert _no_worker == []  # no memory tools, no memory settings: no task, no cost
    with_tools = _turn(_rules_session([{"answer": "Sure."}], tools=["recall"]), "I prefer tea.")
    opted_out = _rules_session([{"answer": "Sure."}], memory={"extraction": False})
    _turn(opted_out, "I prefer email over phone.")
    assert _no_worker == [(with_tools.pk, 1)]


SUBJECT_RULES = [
    {"when": {"user": "^colour (?P<c>\\w+)", "last_tool": None},
     "tool_calls": [{"tool": "remember", "args": {
         "content": "Paint things {{ match.c }}", "subject": "Favourite colour"}}]},
    {"when": {"last_tool": "remember"}, "answer": "{{ result.action }}: {{ result.replaces }}"},
    {"answer": "ok"},
]  # fmt: skip


def test_remember_with_a_subject_updates_that_subject(embeddings):
    owner = UserFactory()
    session = _rules_session(
        SUBJECT_RULES, owner=owner, tools=["remember"], memory={"extraction": False}
    )
    _turn(session, "colour blue")
    session = _turn(session, "colour red")
    answer = Message.objects.filter(session=session, role="assistant").latest("seq")
    assert answer.content == "updated: Paint things blue"
    [item] = MemoryItem.objects.filter(owner=owner)
    assert (item.content, item.subject) == ("Paint things red", "favourite colour")
    assert [v.actor for v in item.versions.all()] == ["tool", "tool"]


def test_a_task_that_dies_before_its_writes_commit_keeps_the_turn_on_retry(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
    monkeypatch,
):
    """The call's record and the writes it decided commit together: a task killed between
    them leaves neither, and the retry (a new call) keeps the turn once."""
    owner = UserFactory()
    session = _turn(_decided_session(openai_server, unique, owner=owner), "I work at Acme now.")
    add = {"action": "add", "target": None, "content": "Works at Acme", "subject": "employer"}
    openai_server.script(_answer(add), _answer(add))
    import engine.phases.after_turn as gate

    real = gate.memory_remember

    def dies(**kwargs):  # type: ignore[no-untyped-def]
        real(**kwargs)
        raise RuntimeError("worker killed")

    monkeypatch.setattr(gate, "memory_remember", dies)
    with pytest.raises(RuntimeError):
        memory_turn_keep(session_id=session.pk, turn=1)
    assert not ModelCall.objects.filter(session=session, purpose="extraction").exists()
    assert not MemoryItem.objects.filter(owner=owner).exists()

    monkeypatch.setattr(gate, "memory_remember", real)
    assert memory_turn_keep(session_id=session.pk, turn=1) == 1
    assert memory_turn_keep(session_id=session.pk, turn=1) == 0  # and once only
    assert ModelCall.objects.filter(session=session, purpose="extraction").count() == 1
    assert [i.content for i in MemoryItem.objects.filter(owner=owner)] == ["Works at Acme"]
    assert len(openai_server.requests) == 2


COFFEE_RULES = [
    {"when": {"user": "coffee", "last_tool": None},
     "tool_calls": [{"tool": "remember", "args": {"content": "Coffee please, tea no more"}}]},
    {"when": {"last_tool": "remember"}, "answer": "Noted."},
    {"answer": "ok"},
]  # fmt: skip


def test_the_turns_extraction_reviews_what_remember_wrote(
    embeddings,
    openai_server: FakeModelServer,  # noqa: F811
    unique: str,  # noqa: F811
):
    """A `remember` the rules could not match (another wording, no subject) is shown to the
    model marked as written this turn, beside the older item it replaces; the model folds
    it into the older one, which keeps its history."""
    owner = UserFactory()
    memory_remember(owner_id=owner.pk, content="Old news", tag="fact")
    tea = memory_remember(owner_id=owner.pk, content="I like tea", tag="preference").item
    cheap = ModelEndpointFactory(
        name=f"cheap-{unique}", api="openai", base_url=openai_server.base_url, model="m"
    )
    session = _rules_session(COFFEE_RULES, owner=owner, cheap_model=cheap, tools=["remember"])
    session = _turn(session, "Switching to coffee")
    fresh = MemoryItem.objects.get(owner=owner, content="Coffee please, tea no more")
    openai_server.script(
        _answer(
            {"action": "delete", "target": fresh.pk, "content": "", "subject": "drink"},
            {
                "action": "update",
                "target": tea.pk,
                "content": "Drinks coffee, not tea",
                "subject": "drink",
            },
        )  # fmt: skip
    )

    assert memory_turn_keep(session_id=session.pk, turn=1) == 2
    shown = json.loads(
        openai_server.requests[0].messages[-1]["content"].split("\n\n")[0].split("\n", 1)[1]
    )
    marked = {m["id"]: m.get("written_this_turn", False) for m in shown}
    assert marked[fresh.pk] is True and marked[tea.pk] is False
    [live] = MemoryItem.objects.filter(owner=owner, superseded_at__isnull=True, tag="preference")
    assert (live.pk, live.content, live.subject) == (tea.pk, "Drinks coffee, not tea", "drink")
    assert [v.content for v in live.versions.order_by("id")] == [
        "I like tea", "Drinks coffee, not tea"
    ]  # fmt: skip
    assert MemoryItem.objects.get(pk=fresh.pk).superseded_at is not None
