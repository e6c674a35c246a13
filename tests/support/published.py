"""What a published figure is, and the checks that it is a recorded run (issue 62, item 4).

`bench/results/headlines.yaml` lists the headline figures README.md, docs/ and bench/README.md quote: the doc,
the text as quoted, the results file it comes from and the JSON path of each number in it, with the format
the doc writes it in. The checks are pure over a folder (the tests hand them the checkout, or tmp files that
break one rule) and return what is wrong, one line a problem, so that a failure names the file and the row:

- `unparsable(results)`: the files under `bench/results/` that do not parse as their extension says
  (`.json`: one JSON value; `.jsonl`: one a non-empty line).
- `headline_problems(row, root)`: the row's file is missing or does not parse, a path leads to no number,
  the number as formatted is not in the quote, or the quote is not in the doc.
- `unknown_commits(results, exists)`: the results files whose provenance (`_common.provenance`: a top-level
  `commit`) names no commit that `exists` finds, or none at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

REGISTRY = Path("bench") / "results" / "headlines.yaml"
PARSED = (".json", ".jsonl")


class Number(BaseModel):
    """One number of a quote: where it is in the results file and how the doc writes it."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="dotted keys, a list index as its number: `job.lora.accuracy_curve.4.1`")
    format: str = Field("{}", description="Python's str.format of the value: `{:.1%}` writes 0.85 as 85.0%")
    scale: float = Field(1.0, description="the value is multiplied by this first: 1e-6 for bytes as MB")

    def text(self, value: float) -> str:
        return self.format.format(value * self.scale if self.scale != 1.0 else value)


class Headline(BaseModel):
    """A figure a doc quotes, and the recorded run it comes from."""

    model_config = ConfigDict(extra="forbid")

    doc: str = Field(description="the quoting file, from the checkout's root: README.md, docs/guide/...")
    quote: str = Field(description="the text as the doc has it (line breaks and runs of spaces as one space)")
    file: str = Field(description="the results file, from the checkout's root: bench/results/...")
    numbers: list[Number] = Field(min_length=1)


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    headlines: list[Headline]


def load_registry(path: Path) -> Registry:
    return Registry.model_validate(yaml.safe_load(path.read_text()))


def parse(path: Path) -> list[Any]:
    """The JSON values of a results file: one for `.json`, one a non-empty line for `.jsonl`.
    Raises ValueError (json.JSONDecodeError) for a file that is not what its extension says."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [json.loads(text)]


def results_files(results: Path) -> Iterator[Path]:
    return (p for p in sorted(results.rglob("*")) if p.is_file() and p.suffix in PARSED)


def unparsable(results: Path) -> list[str]:
    problems = []
    for path in results_files(results):
        try:
            parse(path)
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: not {path.suffix[1:].upper()} ({exc})")
    return problems


def lookup(data: Any, path: str) -> Any:
    """The value at a dotted path (a dict's key, or a list's index); KeyError naming the first missing part."""
    value = data
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(f"{part!r} of {path!r}")
    return value


def one_space(text: str) -> str:
    """Text as a reader sees it: a doc's line breaks and runs of spaces are one space."""
    return re.sub(r"\s+", " ", text).strip()


def headline_problems(row: Headline, root: Path) -> list[str]:
    where = f"{row.doc}: {row.quote!r}"
    problems = []
    doc = root / row.doc
    if not doc.is_file():
        problems.append(f"{where}: the doc {row.doc} does not exist")
    elif one_space(row.quote) not in one_space(doc.read_text()):
        problems.append(f"{where}: not in {row.doc} as quoted")
    results = root / row.file
    if not results.is_file():
        return [*problems, f"{where}: its results file {row.file} does not exist"]
    try:
        (data, *_) = parse(results)
    except (ValueError, UnicodeDecodeError) as exc:
        return [*problems, f"{where}: its results file {row.file} does not parse ({exc})"]
    for number in row.numbers:
        try:
            value = lookup(data, number.path)
        except KeyError as exc:
            problems.append(f"{where}: {row.file} has no {number.path} ({exc})")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{where}: {row.file}'s {number.path} is {value!r}, not a number")
            continue
        text = number.text(value)
        if text not in row.quote:
            problems.append(f"{where}: {row.file}'s {number.path} = {value!r} is {text!r}, not in the quote")
    return problems


DIRTY = "+dirty"


def unknown_commits(results: Path, exists: Callable[[str], bool]) -> list[str]:
    """The results files with provenance (a top-level `commit`, or `machine` as the mapping
    `_common.provenance` writes) whose commit is missing or unknown to `exists` (a hash, without `+dirty`)."""
    problems = []
    for path in results_files(results):
        try:
            values = parse(path)
        except (ValueError, UnicodeDecodeError):
            continue  # unparsable() says so
        for value in values:
            if not isinstance(value, dict):
                continue
            # provenance's `machine` is a mapping (cpu, flags, ...); older benches wrote a line of text there
            if "commit" not in value and not isinstance(value.get("machine"), dict):
                continue
            commit = value.get("commit")
            if not isinstance(commit, str) or not commit:
                problems.append(f"{path}: provenance without a commit ({commit!r})")
            elif not exists(commit.removesuffix(DIRTY)):
                problems.append(f"{path}: commit {commit} is in no history here")
    return problems
