"""The manual (docs/, built by MkDocs): it builds offline with no broken link, every page
is reachable from its navigation, the README stays a front page, and the architecture
page's layout names the packages that exist."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

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


def test_the_architecture_page_names_every_import_contract() -> None:
    """The contracts listed (in bold) under "Import direction" are pyproject's, by name."""
    page = (DOCS / "ARCHITECTURE.md").read_text()
    section = page.split("## Import direction", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^- \*\*(.+?)\*\*", section, flags=re.M)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = [c["name"] for c in config["tool"]["importlinter"]["contracts"]]
    assert sorted(named) == sorted(contracts)
