"""`distillery run examples/local-tools.yaml` on the prepared tools task (built by test_tools_task.py's
fixture or this one's, under the cache's lock): the student's held-out accuracy rises, and samples.jsonl
shows its episodes' turns, each marked by who wrote it, the environment's runs being exactly the
calculator's answers to the student's calls (so the loss, which counts the student's tokens only, never
trained on them)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.tasks.prepared_checks import run_example, task_cache

pytestmark = [pytest.mark.slow, pytest.mark.local_run, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def tools_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.tasks.build.prepare import prepare

    return prepare("tools", root=task_cache(tmp_path_factory))


def test_the_example_learns_and_its_episodes_mark_the_calculators_tokens(tools_task, tmp_path):
    from distillery_runtime.tasks.problems import tools
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    evals = run_example("local-tools.yaml", tools_task, out)
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] == 80
    assert last["eval_accuracy"] >= first["eval_accuracy"] + 0.4, evals
    tokenizer = AutoTokenizer.from_pretrained(tools_task / "student")
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert lines and all("turns" in line for line in lines)
    observed = errors = 0
    for line in lines:
        turns = line["turns"]
        assert turns[0]["by"] == "student"
        for before, turn in itertools.pairwise(turns):
            if turn["by"] != "environment":
                continue
            # The calculator's answer to the student's turn before it, which ended in a call.
            assert before["by"] == "student" and before["text"].endswith(tools.TOOL_CALL_END), line
            assert turn["text"] == tools.observation(before["text"]), line
            assert turn["tokens"] == len(tokenizer(turn["text"], add_special_tokens=False)["input_ids"])
            observed += 1
            errors += turn["text"] == tools.ERROR_OBSERVATION
        assert line["tool_errors"] == sum(t["text"] == tools.ERROR_OBSERVATION for t in turns), line
        assert line["environment_failures"] == 0, line
        assert sum(t["tokens"] for t in turns) == line["tokens"]
    assert observed > 0
    # The runtime counted the calculator's `>E;` answers as tool errors, step by step.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("episode/tool_errors" in r and r["episode/environment_failures"] == 0 for r in records)
    report = (out / "report.md").read_text()
    assert "episodes.png" in report and (out / "episodes.png").is_file()
