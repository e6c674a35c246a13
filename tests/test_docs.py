"""The documentation holds together: every relative link resolves, the front pages stay short, and every
command the README shows names something that exists. Reads files only."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

README_MAX_LINES = 150
BENCH_README_MAX_LINES = 300

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SUBCOMMAND = re.compile(r"""\.add_parser\(\s*["']([\w-]+)["']""")
# Top-level folders of the repository: a command's argument under one of them must exist.
REPO_DIRS = ("scripts/", "examples/", "charts/", "bench/", "docs/", "crds/", "tests/", "docker/", "cli/")


def documentation() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "charts" / "distillery" / "README.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    pages += sorted((ROOT / "bench" / "results").rglob("*.md"))
    return pages


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set()
    for line in text.splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            base = slug(match.group(1))
            name, n = base, 1
            while name in found:
                name, n = f"{base}-{n}", n + 1
            found.add(name)
    return found


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans show link syntax, they are not links
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto: ...
    ]


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in relative_links(page):
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading #{fragment}")
    return problems


@pytest.mark.parametrize("page", documentation(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](missing.md) [bad anchor](page.md#nope)\n")
    assert broken_links(page) == ["missing.md: no such file", "page.md#nope: no heading #nope"]


def test_the_front_pages_stay_short() -> None:
    readme = len((ROOT / "README.md").read_text().splitlines())
    bench = len((ROOT / "bench" / "README.md").read_text().splitlines())
    assert readme <= README_MAX_LINES, f"README.md has {readme} lines; move detail to docs/"
    assert bench <= BENCH_README_MAX_LINES, f"bench/README.md has {bench} lines; move runs to bench/results/"


def subcommands() -> set[str]:
    return set(SUBCOMMAND.findall((ROOT / "cli" / "distillery_cli" / "main.py").read_text()))


def commands(text: str) -> list[list[str]]:
    """Each command of the page's shell blocks, as words: comments dropped, continuations joined, split at
    `&&`, `;` and `|`."""
    found = []
    for block in SHELL_BLOCK.findall(text):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for word in words:
                if word in ("&&", "||", ";", "|"):
                    found.append(current)
                    current = []
                else:
                    current.append(word)
            found.append(current)
    return [c for c in found if c]


def missing_in(command: list[str], known_subcommands: set[str]) -> list[str]:
    problems = []
    program, *args = command
    name = program.removeprefix(".venv/bin/")
    if program.startswith(("./", "scripts/", "bench/")) and not (ROOT / program).exists():
        problems.append(f"{program}: no such file")
    if name == "distillery" and (not args or args[0] not in known_subcommands):
        problems.append(f"distillery {args[0] if args else ''}: no such subcommand")
    if name in ("python", "python3") and args and args[0].endswith(".py") and not (ROOT / args[0]).exists():
        problems.append(f"{args[0]}: no such file")
    for arg in args:
        if arg.startswith(REPO_DIRS) and not (ROOT / arg).exists():
            problems.append(f"{arg}: no such file")
    return list(dict.fromkeys(problems))


def test_every_command_the_readme_shows_exists() -> None:
    shown = commands((ROOT / "README.md").read_text())
    assert shown, "README.md shows no shell commands"
    known = subcommands()
    assert {"run", "validate", "plan", "render", "operator"} <= known
    problems = [p for command in shown for p in missing_in(command, known)]
    assert problems == []


def test_the_command_check_catches_what_does_not_exist() -> None:
    known = subcommands()
    text = (
        "```bash\n./scripts/nope.sh && .venv/bin/distillery frobnicate x.yaml\n"
        "python bench/nope.py   # comment\nkubectl apply -f examples/nope.yaml\n```\n"
    )
    problems = [p for command in commands(text) for p in missing_in(command, known)]
    assert problems == [
        "./scripts/nope.sh: no such file",
        "distillery frobnicate: no such subcommand",
        "bench/nope.py: no such file",
        "examples/nope.yaml: no such file",
    ]
