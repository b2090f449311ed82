"""The shell and Python examples of the README and the manual, and what each says of itself.

Every such block is preceded (blank lines aside) by one marker, an HTML comment that the
built site does not show and a reader of the source does:

    <!-- run -->                              tests/e2e/test_docs_examples.py runs it against
                                              the live stack with the demo applied
    <!-- run by tests/agentplatform/x.py -->  that test runs it (it names the page)
    <!-- not run: needs a real OpenAI key --> the reason it cannot run in CI

The blocks of one page marked `run` are run in order in one shell, as a reader would in
one terminal.
"""

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"bash", "sh", "shell", "console", "python"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", flags=re.M | re.S)
MARKER = re.compile(r"<!--\s*(run by \S+|run|not run:[^>]*\S)\s*-->")


@dataclass(frozen=True)
class Block:
    page: str  # README.md or docs/<page>.md
    line: int
    language: str
    code: str
    marker: str  # "run", "run by <path>", "not run: <reason>", or "" when missing

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runner(self) -> str:
        """The test file that runs it ("" when it is not run)."""
        if self.marker == "run":
            return "tests/e2e/test_docs_examples.py"
        return self.marker.removeprefix("run by ") if self.marker.startswith("run by ") else ""


def marker_before(text: str, start: int) -> str:
    before = text[:start].rstrip().rsplit("\n", 1)[-1]
    found = MARKER.fullmatch(before.strip())
    return found.group(1) if found else ""


def blocks() -> list[Block]:
    found = []
    for path in PAGES:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) in LANGUAGES:
                found.append(
                    Block(
                        page=str(path.relative_to(ROOT)),
                        line=text[: match.start()].count("\n") + 1,
                        language=match.group(1),
                        code=match.group(2),
                        marker=marker_before(text, match.start()),
                    )
                )
    return found
