"""`python -m bench.micro`: what single database operations of a step cost, ORM vs raw SQL.

Not part of `make bench` (no targets): the evidence behind the suggestions in
bench/README.md. Each operation runs N times after a warm-up on the bench
database (recreated, so do not run it while `make bench` runs); the figures
are the CPU time of this thread (`time.thread_time`) and the wall time per
operation. The raw-SQL variants are sketches of a possible change, written
against today's tables, not production code.
"""

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from . import environment, fixtures

FIELDS = ["status", "output", "error", "elapsed_ms", "finished_at"]
ORDERS = {
    "count": 3,
    "days": 7,
    "logistics_status": "exception",
    "orders": [
        {
            "order_number": f"SO-100{i}",
            "customer_id": i,
            "customer_name": "Ada Lovelace",
            "placed_at": "2026-11-27",
            "exception": "parcel held at customs",
        }
        for i in range(3)
    ],
}
MOVE_SQL = """
WITH s AS (
  UPDATE agent_sessions_session
     SET state = %s, version = version + 1, event_seq = event_seq + 1, step = step + 1,
         updated_at = now(), lease_expires_at = now() + make_interval(secs => %s)
   WHERE id = %s AND version = %s
  RETURNING id, version, event_seq, step, turn, message_seq, now() AS now),
e AS (INSERT INTO agent_sessions_event (session_id, seq, type, data, created_at{event_cols})
      SELECT id, event_seq, %s, %s::jsonb, now{event_vals} FROM s RETURNING 1),
t AS (INSERT INTO agent_sessions_transition (session_id, from_state, to_state, trigger, reason, version, turn,
                                             actor, at{transition_cols})
      SELECT id, %s, %s, %s, %s, version, turn, '', now{transition_vals} FROM s RETURNING 1),
c AS (INSERT INTO agent_sessions_checkpoint (session_id, step, turn, state, message_seq, context, size_bytes,
                                             created_at{checkpoint_cols})
      SELECT id, step, turn, %s, message_seq, %s::jsonb, %s, now{checkpoint_vals} FROM s RETURNING 1)
SELECT version FROM s"""
SKETCHED = {
    "event": {"id", "session_id", "seq", "type", "data", "created_at"},
    "transition": {
        "id",
        "session_id",
        "from_state",
        "to_state",
        "trigger",
        "reason",
        "version",
        "turn",
        "actor",
        "at",
    },
    "checkpoint": {
        "id",
        "session_id",
        "step",
        "turn",
        "state",
        "message_seq",
        "context",
        "size_bytes",
        "created_at",
    },
}


def move_sql() -> tuple[str, dict[str, list[Any]]]:
    """MOVE_SQL, plus any columns added to the three tables since it was written, at their defaults."""
    from django.db import connection

    from record.models import Checkpoint, Event, Transition

    parts: dict[str, str] = {}
    extra: dict[str, list[Any]] = {}
    for key, model in (("event", Event), ("transition", Transition), ("checkpoint", Checkpoint)):
        fields = [f for f in model._meta.concrete_fields if f.column not in SKETCHED[key]]
        parts[f"{key}_cols"] = "".join(f", {f.column}" for f in fields)
        parts[f"{key}_vals"] = ", %s" * len(fields)
        extra[key] = [f.get_db_prep_save(f.get_default(), connection) for f in fields]
    return MOVE_SQL.format(**parts), extra


def measure(label: str, fn: Callable[[], Any], n: int, rows: list[dict[str, Any]]) -> None:
    for _ in range(max(n // 10, 5)):
        fn()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    row = {
        "operation": label,
        "cpu_ms": round((time.thread_time() - cpu) / n * 1000, 3),
        "wall_ms": round((time.perf_counter() - wall) / n * 1000, 3),
    }
    rows.append(row)
    print(f"  {label:62s} CPU {row['cpu_ms']:7.3f} ms   wall {row['wall_ms']:7.3f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__)
    parser.add_argument("-n", type=int, default=200, help="repetitions per operation (default 200)")
    args = parser.parse_args(argv)
    with environment.exclusive():
        environment.prepare(f"bench-micro-{time.time_ns()}")
        environment.django_setup()
        fixtures.install()
        rows: list[dict[str, Any]] = []
        _run(args.n, rows)
        out = environment.ROOT / "bench" / "results" / "micro-latest.json"
        out.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


def _run(n: int, rows: list[dict[str, Any]]) -> None:
    from django.db import connection, transaction
    from django.utils import timezone

    from record.models import Agent, Message, Session, ToolCall
    from tools.execution import tools_for_agent

    session = fixtures.sessions_create("bench-demo", 1)[0]
    agent = Agent.objects.get(pk=session.agent_id)
    for i in range(50):  # a history of 50 messages, as after 4-5 demo turns
        Message.objects.create(
            session=session,
            seq=i + 1,
            role="tool" if i % 2 else "assistant",
            content=json.dumps(ORDERS),
            data=ORDERS if i % 2 else None,
        )
    print("reads a step makes today")
    measure(
        "Session + agent reload (select_related, .first())",
        lambda: Session.objects.select_related("agent").filter(pk=session.pk).first(),
        n,
        rows,
    )

    def reload_raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT state, version, lease_owner, cancel_requested, queued_count, turn, iteration, step"
                " FROM agent_sessions_session WHERE id = %s",
                [session.pk],
            )
            cursor.fetchone()

    measure("  the columns the loop needs, raw SQL", reload_raw, n, rows)
    endpoints = [f for f in ("model", "fallback_model", "candidate_model") if hasattr(Agent, f)]
    measure(
        "Agent + model endpoints (select_related .get())",
        lambda: Agent.objects.select_related(*endpoints).get(pk=session.agent_id),
        n,
        rows,
    )
    measure(
        "tools_for_agent (3 Tool rows)",
        lambda: tools_for_agent(list(agent.tools), session.role),
        n,
        rows,
    )
    measure(
        "history: 50 messages as ORM objects",
        lambda: list(Message.objects.filter(session=session).order_by("seq")),
        n,
        rows,
    )

    print("updating tool calls with their results (one transaction)")
    tag = [0]

    def calls(count: int) -> list[Any]:
        tag[0] += 1
        made = [
            ToolCall(
                session=session,
                turn=1,
                step=1,
                position=i,
                call_id=f"c{i}",
                tool_name="query_orders",
                input={"days": 7},
                idempotency_key=f"micro-{tag[0]}-{i}",
            )
            for i in range(count)
        ]
        ToolCall.objects.bulk_create(made)
        now = timezone.now()
        for call in made:
            call.status, call.output, call.error, call.elapsed_ms, call.finished_at = (
                "success",
                ORDERS,
                "",
                3,
                now,
            )
        return made

    def bulk_update(made: list[Any]) -> None:
        with transaction.atomic():
            ToolCall.objects.bulk_update(made, FIELDS)

    def per_row(made: list[Any]) -> None:
        with transaction.atomic():
            for call in made:
                ToolCall.objects.filter(pk=call.pk).update(**{f: getattr(call, f) for f in FIELDS})

    def values(made: list[Any]) -> None:
        tuples = ", ".join(
            ["(%s::bigint, %s, %s::jsonb, %s, %s::int, %s::timestamptz)"] * len(made)
        )
        params: list[Any] = []
        for c in made:
            params += [c.pk, c.status, json.dumps(c.output), c.error, c.elapsed_ms, c.finished_at]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE agent_sessions_toolcall t SET status = v.status, output = v.output, error = v.error,"
                " elapsed_ms = v.elapsed_ms, finished_at = v.finished_at"
                f" FROM (VALUES {tuples}) AS v(id, status, output, error, elapsed_ms, finished_at) WHERE t.id = v.id",
                params,
            )

    for count in (1, 3):
        for label, fn in (
            ("ToolCall bulk_update (today)", bulk_update),
            ("filter(pk=).update() per call", per_row),
            ("raw UPDATE ... FROM (VALUES ...)", values),
        ):
            made = calls(count)
            measure(f"{count} call(s): {label}", lambda fn=fn, made=made: fn(made), n, rows)

    print("a tool-loop move (state, 1 event, transition, checkpoint), committed")
    from engine.store.commit import Step, step_commit
    from record.states import Trigger

    Session.objects.filter(pk=session.pk).update(state="tool_loop")
    live = Session.objects.get(pk=session.pk)

    def orm_move() -> None:
        if (
            live.state == "processing"
        ):  # back to tool_loop the cheap way, outside the measurement's point
            Session.objects.filter(pk=live.pk).update(state="tool_loop", version=live.version + 1)
            live.state, live.version = "tool_loop", live.version + 1
        step_commit(
            Step(
                session=live,
                trigger=Trigger.MODEL_CALL,
                reason="x",
                lease_seconds=10.0,
                checkpoint={"turn": live.turn, "iteration": 1, "phase": "model"},
            )
        )

    measure("step_commit (today: UPDATE RETURNING + 3 ORM inserts) + reset", orm_move, n // 2, rows)
    measure(
        "  the reset alone (one .update(), to subtract)",
        lambda: Session.objects.filter(pk=live.pk).update(state="tool_loop"),
        n,
        rows,
    )
    Session.objects.filter(pk=session.pk).update(state="tool_loop")
    state = {"version": Session.objects.get(pk=session.pk).version, "state": "tool_loop"}

    sql, extra = move_sql()

    def raw_move() -> None:
        to = "processing" if state["state"] == "tool_loop" else "tool_loop"
        event = json.dumps(
            {"from": state["state"], "to": to, "trigger": "model_call", "reason": "x"}
        )
        context = json.dumps({"turn": 1, "iteration": 1, "phase": "model", "state": to})
        params = [
            *(to, 10.0, session.pk, state["version"], "state.changed", event),
            *extra["event"],
            *(state["state"], to, "model_call", "x"),
            *extra["transition"],
            *(to, context, len(context)),
            *extra["checkpoint"],
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            state["version"] = cursor.fetchone()[0]
        state["state"] = to

    measure("the same move as one statement (data-modifying CTE)", raw_move, n // 2, rows)
    connection.close()


if __name__ == "__main__":
    raise SystemExit(main())
