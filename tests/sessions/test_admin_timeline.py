"""The run page's timeline grouped by node (sessions/admin/timeline.py `group_by_node`)."""

from datetime import UTC, datetime, timedelta

from sessions.admin.timeline import TimelineItem, group_by_node
from sessions.status import CALLS

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _row(
    n: int, kind: str, summary: str, node: str = "", mark: str = "", visit: int = 0
) -> TimelineItem:
    # The rows as session_timeline gives them: sorted, each with its node (if any) and mark.
    return TimelineItem(
        at=T0 + timedelta(seconds=n), rank=0, order=0, kind=kind, label=kind, seq=n,
        summary=summary, detail="", url="", node=node, mark=mark, visit=visit,
    )  # fmt: skip


def _run() -> list[TimelineItem]:
    """A 4-node run: lookup retried once (its call failed, a pause, the same call again),
    check, notify a map of three items (one failed), tell, then a revisit of check."""
    rows = [
        ("message", "user: start", "", ""),
        ("transition", "idle → processing", "", ""),
        # Same commit: the call's row sorts before its node's node.started (kinds rank so).
        ("toolcall", "order_status(...) running", "lookup", ""),
        ("event", "node.started lookup", "lookup", "started"),
        ("event", "tool.finished lookup#1 failed", "lookup", ""),
        ("toolcall", "wait(...) retry of lookup", "lookup", ""),
        ("event", "tool.finished lookup#1 ok", "lookup", ""),
        ("event", "node.finished lookup", "lookup", "finished"),
        ("checkpoint", "step 3", "lookup", ""),
        ("event", "node.started check", "check", "started"),
        ("event", "node.finished check", "check", "finished"),
        ("event", "node.started notify", "notify", "started"),
        *[("toolcall", f"notify_customer item {i}", "notify", "") for i in range(3)],
        ("event", "tool.finished notify#1[1] failed", "notify", ""),
        ("transition", "tool_wait → processing", "", ""),  # no node: the open one's
        ("event", "node.finished notify", "notify", "finished"),
        ("event", "node.started tell", "tell", "started"),
        ("event", "model.finished", "", ""),
        ("event", "node.finished tell", "tell", "finished"),
        ("event", "node.started check", "check", "started"),
        ("event", "node.failed check", "check", "failed"),
        ("event", "turn.finished", "", ""),
    ]
    return [
        _row(n, kind, summary, node, mark, 2 if summary == "node.started check" and n > 15 else 1)
        for n, (kind, summary, node, mark) in enumerate(rows)
    ]


def test_a_runs_rows_group_under_their_nodes_in_the_order_of_the_path() -> None:
    groups = group_by_node(_run())

    assert [(g.node, g.visit, g.state) for g in groups] == [
        ("", 0, ""),
        ("lookup", 1, "visited"),
        ("check", 1, "visited"),
        ("notify", 1, "visited"),
        ("tell", 1, "visited"),
        ("check", 2, "failed"),
        ("", 0, ""),
    ]
    summaries = [[i.summary for i in g.items] for g in groups]
    # The retry stays in its node's group, with the call row that came before node.started.
    assert summaries[1] == [
        "node.started lookup",
        "order_status(...) running",
        "tool.finished lookup#1 failed",
        "wait(...) retry of lookup",
        "tool.finished lookup#1 ok",
        "node.finished lookup",
        "step 3",
    ]
    # A map's items and a row of no node while the map was open.
    assert summaries[3][1:4] == [f"notify_customer item {i}" for i in range(3)]
    assert "tool_wait → processing" in summaries[3]
    assert summaries[4] == ["node.started tell", "model.finished", "node.finished tell"]
    assert summaries[0] == ["user: start", "idle → processing"]
    assert summaries[6] == ["turn.finished"]
    # Every row once, none lost.
    assert sorted(i.seq or 0 for g in groups for i in g.items) == list(range(len(_run())))


def test_a_groups_status_is_said_in_the_calls_words() -> None:
    items = _run()
    groups = group_by_node(items[:12])  # notify started, not finished: running

    assert [g.status for g in groups[1:]] == [CALLS["ok"], CALLS["ok"], CALLS["running"]]
    assert group_by_node(items)[5].status.label == "failed"


def test_a_session_of_no_workflow_is_one_group_of_the_run() -> None:
    items = [_row(n, "event", f"e{n}", node=f"call_{n}") for n in range(3)]

    groups = group_by_node(items)

    assert len(groups) == 1 and groups[0].node == "" and len(groups[0].items) == 3
    assert group_by_node([]) == []


def test_a_human_node_still_open_waits_for_a_person_not_runs() -> None:
    items = [_row(0, "event", "node.started review", "review", "started", 1)]
    items[0].node_kind = "human"

    (group,) = group_by_node(items)

    assert group.status == CALLS["waiting"] and group.status.label == "waiting for approval"
