"""`make test-changed` selects: after a change to one function, only the tests that ran it
run again. With the Makefile's own pytest flags, on a project of three tests in a temporary
directory (testmon turned selection off when `-m` was given, and every run ran them all)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CODE = "def a():\n    return 1\n\n\ndef b():\n    return 2\n"
TESTS = {
    "test_a.py": "from code_under_test import a\n\n\ndef test_a():\n    assert a() == 1\n",
    "test_b.py": "from code_under_test import b\n\n\ndef test_b():\n    assert b() in (2, 3)\n",
    "test_e2e.py": "import pytest\n\n\n@pytest.mark.e2e\ndef test_live():\n    pass\n",
}


def _makefile_flags() -> list[str]:
    recipe = (ROOT / "Makefile").read_text()
    found = re.search(r"\$\(PY\) -m pytest (--testmon.*?) \$\(PYTEST_ARGS\)", recipe)
    assert found, "test-changed's pytest command is not where this test looks for it"
    # A selection's run (a recording run differs in its number of workers only).
    return shlex.split(found.group(1).replace("$$workers", "0"))


def _run(project: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *_makefile_flags(), "-p", "no:django", "-rA"],
        cwd=project,
        env={**env, "TESTMON_DATAFILE": str(project / ".testmondata")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr
    return done.stdout


def _ran(output: str) -> set[str]:
    return set(re.findall(r"^PASSED (\S+)", output, flags=re.M))


def test_a_change_to_one_function_reruns_only_the_tests_that_ran_it(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: live\n")
    (tmp_path / "code_under_test.py").write_text(CODE)
    for name, text in TESTS.items():
        (tmp_path / name).write_text(text)

    assert _ran(_run(tmp_path)) == {"test_a.py::test_a", "test_b.py::test_b"}  # records
    assert _ran(_run(tmp_path)) == set()  # nothing changed
    (tmp_path / "code_under_test.py").write_text(CODE.replace("return 2", "return 3"))
    assert _ran(_run(tmp_path)) == {"test_b.py::test_b"}
