"""The manual (docs/, built by MkDocs): it builds offline with no broken link, every page
is reachable from its navigation, the README stays a front page, and the architecture
page's layout names the packages that exist."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages(entries: list) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            if isinstance(value, list):
                pages |= _nav_pages(value)
            else:
                pages.add(value)
    return pages


def test_the_manual_builds_strict_and_offline(tmp_path: Path) -> None:
    # strict: a link to a page that does not exist fails the build.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    index = (tmp_path / "index.html").read_text()
    # Offline: no web font and no script or stylesheet from another host.
    assert "fonts.googleapis" not in index
    assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', index), "a CDN asset"


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages == _nav_pages(config["nav"])


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make run" in readme and "make test" in readme
    # Every manual page it links to exists.
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def test_the_architecture_layout_names_every_package() -> None:
    page = (DOCS / "ARCHITECTURE.md").read_text()
    layout = page.split("## Layout", 1)[1].split("```", 2)[1]
    listed = set(re.findall(r"^([a-z_]+)/", layout, flags=re.M))
    packages = {
        p.parent.name
        for p in ROOT.glob("*/__init__.py")
        if p.parent.name not in {"tests", "bench", "devstack", "examples", "clients"}
    }
    assert packages <= listed, f"packages missing from the layout: {packages - listed}"
    assert listed <= packages | {
        "tests",
        "bench",
        "devstack",
        "templates",
        "config",
        "docs",
        "clients",
    }, f"listed but absent: {listed - packages}"


PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_every_make_target_the_manual_names_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*)(?: [\w .-]*)?:(?!=)", makefile, flags=re.M))
    named = {
        (page.name, target)
        for page in PAGES
        # In code: `make x`, a command line's `make x`, or `VAR=value make x`.
        for target in re.findall(r"(?:^|`|=\S+ )make ([a-z][\w-]*)", page.read_text(), flags=re.M)
    }
    assert named, "the check reads no `make` command"
    assert sorted(n for n in named if n[1] not in targets) == []


# A path the manual names, up to a space, a quote, a bracket or a query string.
PATH = re.compile(
    r"(?<![\w.:/-])(/(?:api/v1|admin|openai/v1|playground|readyz|healthz|metrics)\b[^\s`'\")\]?#,;*]*)"
)
SAMPLE_ID = "00000000-0000-0000-0000-000000000001"
# A base URL the manual gives a client: one of its routes stands for it.
BASES = {"/openai/v1": "/openai/v1/chat/completions"}


def _named_paths() -> set[tuple[str, str]]:
    found = set()
    for page in PAGES:
        for path in PATH.findall(page.read_text()):
            # Placeholders ($SID, <id>, {session_id}, ...) stand for an id.
            path = re.sub(r"\$\w+|<[^/>]*>?|\{[^/}]*\}?|:id\b", SAMPLE_ID, path)
            path = path.rstrip(".")
            found.add((page.name, BASES.get(path, path)))
    return found


def test_every_url_the_manual_names_is_routed() -> None:
    from django.urls import Resolver404, resolve

    named = _named_paths()
    assert len(named) > 20, named
    unrouted = []
    for page, path in sorted(named):
        try:
            resolve(path)
        except Resolver404:
            try:  # named without its trailing slash ("/openai/v1", "/approvals/<id>")
                resolve(path + "/")
            except Resolver404:
                unrouted.append(f"{page}: {path}")
    assert unrouted == []


def test_the_url_check_finds_a_path_nobody_routes() -> None:
    from django.urls import Resolver404, resolve

    assert PATH.findall("see `/api/v1/sessions/$SID/nonsense/` and /admin/") == [
        "/api/v1/sessions/$SID/nonsense/",
        "/admin/",
    ]
    with pytest.raises(Resolver404):
        resolve(f"/api/v1/sessions/{SAMPLE_ID}/nonsense/")


def test_the_architecture_page_names_every_import_contract() -> None:
    """The contracts listed (in bold) under "Import direction" are pyproject's, by name."""
    page = (DOCS / "ARCHITECTURE.md").read_text()
    section = page.split("## Import direction", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^- \*\*(.+?)\*\*", section, flags=re.M)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = [c["name"] for c in config["tool"]["importlinter"]["contracts"]]
    assert sorted(named) == sorted(contracts)
