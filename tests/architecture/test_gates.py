"""The gates read and judge; none writes the record, and none imports another
(docs/ARCHITECTURE.md, engine floors).

A gate that decides something should be written returns it (an intent on its verdict: the
approvals to ask for, the probes to record, the memory to keep) and a phase or a move
writes it through the store. Read from the source of every module under `engine/gates/`:
no import of the store, no transaction, no ORM write (`save`, `delete`, `bulk_*`,
`*_or_create`, `select_for_update`, `.objects….create/update`) and no SQL that inserts,
updates or deletes.

A port's own check-and-take stays the gate's (a credit reservation, a budget hold, a rate
limit's token: the check and the take are one atomic statement of the port's, and the
verdict is its answer); it writes the port's tables, never the record's. Any other writer
of a port (a billing or memory service, a `*_raise`, a `*_touch`) is the phase's to call
(`port_writes`; the takes allowed are named in `TAKES`, each with why).
"""

import ast
import re

from tests.architecture.test_import_contracts import ROOT

GATES = ROOT / "engine" / "gates"
ALWAYS_WRITES = frozenset(
    {"save", "delete", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}
)
MANAGER_WRITES = frozenset({"create", "update"})  # a dict's update is not one: a manager's is
LOCKS = frozenset({"select_for_update"})
SQL_WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b")


def _chain_has_objects(node: ast.AST) -> bool:
    """Whether a call's receiver goes through a model's manager (`X.objects…`)."""
    while True:
        if isinstance(node, ast.Attribute):
            if node.attr == "objects":
                return True
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return False


def writes(source: str) -> list[tuple[int, str]]:
    """(line, what) of every write of the record found in a module's source."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            names = []
        for name in names:  # the module first: one finding per import statement
            if name == "engine.store" or name.startswith("engine.store."):
                found.append((node.lineno, f"imports {name}"))
                break
            if name == "django.db.transaction":
                found.append((node.lineno, "imports the transaction"))
                break
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr in ALWAYS_WRITES or attr in LOCKS or attr == "atomic":
                found.append((node.lineno, f".{attr}()"))
            elif attr in MANAGER_WRITES and _chain_has_objects(node.func.value):
                found.append((node.lineno, f".objects….{attr}()"))
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (match := SQL_WRITE.search(node.value))
        ):
            found.append((node.lineno, f"SQL {match.group(1).split()[0]}"))
    return found


def test_no_gate_writes_the_record() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(GATES.rglob("*.py"))
        if (hits := writes(path.read_text()))
    }
    assert found == {}


PLANTED = {
    "from engine.store.side_calls import side_call_commit": "imports engine.store.side_calls",
    "import engine.store.commit": "imports engine.store.commit",
    "from django.db import transaction": "imports the transaction",
    "with transaction.atomic():\n    pass": ".atomic()",
    "call.save()": ".save()",
    "call.save(update_fields=['status'])": ".save()",
    "Session.objects.filter(pk=1).delete()": ".delete()",
    "ToolCall.objects.filter(pk=call.pk).update(probes=1)": ".objects….update()",
    "ModelCall.objects.create(session=s)": ".objects….create()",
    "Message.objects.bulk_create(rows)": ".bulk_create()",
    "Session.objects.select_for_update().get(pk=1)": ".select_for_update()",
    "cursor.execute('UPDATE agent_sessions_session SET state = %s', [s])": "SQL UPDATE",
    "cursor.execute('INSERT INTO t (a) VALUES (1)')": "SQL INSERT",
    "cursor.execute('DELETE FROM t WHERE id = 1')": "SQL DELETE",
}


def test_each_planted_write_is_found() -> None:
    for planted, what in PLANTED.items():
        assert [w for _, w in writes(planted)] == [what], planted


def test_reads_and_a_dicts_update_are_not_writes() -> None:
    reads = """
from engine.model.calls import side_call
config: dict = {}
config.update({"a": 1})
rows = ToolCall.objects.filter(pk=1).values_list("pk", flat=True)
cursor.execute("SELECT id FROM t WHERE updated_at > %s", [now])
"""
    assert writes(reads) == []


def test_a_write_planted_in_a_gate_fails_the_scan(tmp_path, monkeypatch) -> None:
    """The scan over the tree, on a copy of the gates with one write planted, fails."""
    copy = tmp_path / "engine" / "gates"
    copy.mkdir(parents=True)
    for path in GATES.glob("*.py"):
        (copy / path.name).write_text(path.read_text())
    risk = copy / "risk.py"
    risk.write_text(risk.read_text() + "\n\ndef planted(call):\n    call.save()\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["GATES"]), "GATES", copy)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    try:
        test_no_gate_writes_the_record()
    except AssertionError as failed:
        assert "engine/gates/risk.py" in str(failed)
    else:
        raise AssertionError("the planted write was not found")


def gate_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import of another gate: `engine.gates.<x>` (the protocol,
    `engine.gates` itself, is every gate's) or a relative `.x`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0:
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif node.module and node.module.startswith("engine.gates."):
                found.append((node.lineno, node.module))
            elif node.module == "engine.gates":
                found += [
                    (node.lineno, f"engine.gates.{a.name}")
                    for a in node.names
                    if (GATES / f"{a.name}.py").exists()
                ]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name) for a in node.names if a.name.startswith("engine.gates.")
            ]
    return found


def test_no_gate_imports_another() -> None:
    """Each gate judges on its own: what several need (the credits check, what the model
    sees, the world around a step) lives on the model floor below, the result shapes in the
    protocol (engine/gates/__init__.py); a chain of gates is not rebuilt."""
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(GATES.glob("*.py"))
        if path.name != "__init__.py" and (hits := gate_imports(path.read_text()))
    }
    assert found == {}


def test_each_planted_gate_import_is_found() -> None:
    planted = {
        "from engine.gates.budget import GateRead": ["engine.gates.budget"],
        "from engine.gates import budget": ["engine.gates.budget"],
        "import engine.gates.metering": ["engine.gates.metering"],
        "from .children import AGENT_TOOL_PREFIX": [".children"],
    }
    for source, modules in planted.items():
        assert [m for _, m in gate_imports(source)] == modules, source
    assert gate_imports("from engine.gates import Contribution, Stop") == []


# The ports' writers a gate may not call: a gate returns what should be written (the
# notices a read crossed, the memory items a block used) and the phase writes it.
PORT_WRITERS = frozenset({"billing.services", "memory.services", "billing.ratelimit"})
WRITER_NAME = re.compile(r"_(raise|touch)$")
# What a gate may still take from those modules, by name, and why: a check-and-take is one
# atomic statement of the port's (the check and the take cannot be split between a gate
# and a phase without a race), and the gate's verdict is its answer.
TAKES = {
    "budget_reserve": "budget.py `budget_hold`: holds a call's worst case against the "
    "owner's shared budgets, refused in the same statement if they are spent",
    "rate_limit_take": "budget.py, tool_limits.py: counts a call in the rate window or "
    "answers the wait, in one statement",
    "credit_reserve_statement": "metering.py: reserves a paid call's credits, refused "
    "in the same statement if the balance is short",
    "pool_grant_statement": "credit_pool.py: takes points of the credit pool or queues "
    "the request, in one statement",
    # Not writes: the take's answer read back, and the shapes it comes in.
    "reservation_of": "metering.py: the reservation statement's row, as a Reservation",
    "pool_grant_of": "credit_pool.py: the pool statement's row, as a PoolGrant",
    "Reservation": "the shape of a credit reservation",
    "PoolGrant": "the shape of a pool grant",
    "RateLimit": "the shape of a rate limit",
}


def port_writes(source: str) -> list[tuple[int, str]]:
    """(line, name) of each writer of a port a module imports: a name from billing.services,
    memory.services or billing.ratelimit not in TAKES, the module itself (its functions
    would be called through it), or any `*_raise`/`*_touch` wherever it comes from."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if (
                    full in PORT_WRITERS
                    or node.module in PORT_WRITERS
                    and alias.name not in TAKES
                    or WRITER_NAME.search(alias.name)
                ):
                    found.append((node.lineno, full))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in PORT_WRITERS]
    return found


def test_no_gate_calls_a_ports_writer() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(GATES.rglob("*.py"))
        if (hits := port_writes(path.read_text()))
    }
    assert found == {}


def test_each_planted_port_writer_is_found() -> None:
    planted = {
        "from billing.services import budget_reserve, notices_raise": [
            "billing.services.notices_raise"
        ],
        "from memory.services import memory_touch": ["memory.services.memory_touch"],
        "from memory.services import memory_remember": ["memory.services.memory_remember"],
        "from billing import services": ["billing.services"],
        "import memory.services": ["memory.services"],
        "from billing.notices import notices_raise": ["billing.notices.notices_raise"],
        "from memory.elsewhere import items_touch": ["memory.elsewhere.items_touch"],
    }
    for source, names in planted.items():
        assert [n for _, n in port_writes(source)] == names, source
    takes = "from billing.services import PoolGrant, pool_grant_of, pool_grant_statement"
    assert port_writes(takes) == []
    assert port_writes("from billing.notices import notice_candidates") == []


def test_a_port_writer_planted_in_a_gate_fails_the_scan(tmp_path, monkeypatch) -> None:
    """Before this check the budget gate raised the cost notices and the memory gate
    marked the items it placed; either call put back in a copy of the gates fails."""
    copy = tmp_path / "engine" / "gates"
    copy.mkdir(parents=True)
    for path in GATES.glob("*.py"):
        (copy / path.name).write_text(path.read_text())
    memory = copy / "memory.py"
    memory.write_text("from memory.services import memory_touch\n" + memory.read_text())
    monkeypatch.setattr(__import__(__name__, fromlist=["GATES"]), "GATES", copy)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    try:
        test_no_gate_calls_a_ports_writer()
    except AssertionError as failed:
        assert "engine/gates/memory.py" in str(failed)
    else:
        raise AssertionError("the planted writer was not found")


# The answers a gate gave before the one protocol: a model step's now come in a Verdict
# (its `stop`, its `contribution`, a loop guard's `intent`), never on their own.
OWN_SHAPES = frozenset({"Stop", "Contribution", "GuardVerdict"})


def own_shapes(source: str) -> list[tuple[int, str]]:
    """(line, function) of each public module-level function (a gate; a `_helper` is its
    own) answering a Stop, a Contribution or a GuardVerdict outside a `Verdict[...]`."""
    found: list[tuple[int, str]] = []
    for node in ast.parse(source).body:
        if (
            not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            or node.returns is None
            or node.name.startswith("_")
        ):
            continue
        inside = {
            id(n)
            for sub in ast.walk(node.returns)
            if isinstance(sub, ast.Subscript)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "Verdict"
            for n in ast.walk(sub.slice)
        }
        words: set[str] = set()
        for n in ast.walk(node.returns):
            if id(n) in inside:
                continue
            if isinstance(n, ast.Name):
                words.add(n.id)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):  # "Stop | None"
                words |= set(re.findall(r"\w+", n.value))
        if words & OWN_SHAPES:
            found.append((node.lineno, node.name))
    return found


def test_every_gate_answers_a_verdict() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(GATES.glob("*.py"))
        if path.name != "__init__.py" and (hits := own_shapes(path.read_text()))
    }
    assert found == {}


def test_each_planted_own_shape_is_found() -> None:
    planted = {
        "def budget_stop(gate) -> Stop | None:\n    return None": ["budget_stop"],
        "def layers(s) -> Contribution:\n    return Contribution()": ["layers"],
        "def check(steps) -> GuardVerdict | None:\n    return None": ["check"],
        "def note(s) -> 'Contribution':\n    return Contribution()": ["note"],
    }
    for source, names in planted.items():
        assert [n for _, n in own_shapes(source)] == names, source
    fine = """
def budget_stop(gate) -> Verdict[None]: ...
def check(steps) -> Verdict[GuardVerdict]: ...
def _loop(steps) -> GuardVerdict | None: ...
def route(session) -> Route: ...
"""
    assert own_shapes(fine) == []
