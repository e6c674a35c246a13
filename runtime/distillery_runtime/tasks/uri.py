"""Resolve `synthetic://<task>/<artefact>` strings (model and data paths in a job spec) to local paths.

`synthetic://addition/teacher` and `.../student` are model directories (transformers + vLLM),
`.../train` and `.../eval` are jsonl datasets; `synthetic://fibonacci/...` the same for the
long-generation task, `synthetic://chat-math/...` for the chat-format one (Qwen-like models, messages
rows), `synthetic://worked-sum/...` for the repairable one (its student is an SFT checkpoint),
`synthetic://tools/...` for the tool-use one (multi-turn episodes with a calculator). The first resolution
prepares the task (cached).
`task_for(data_path)` is the task (and so the grader) a job's training data belongs to.
"""

from __future__ import annotations

from pathlib import Path

from distillery.plan.grader import SYNTHETIC_SCHEME
from distillery_runtime.tasks.base import ANSWER_MATCH, Task
from distillery_runtime.tasks.problems import addition, chat_math, fibonacci, tools, worked_sum

SCHEME = SYNTHETIC_SCHEME
ARTEFACTS = {"teacher": "teacher", "student": "student", "train": "train.jsonl", "eval": "eval.jsonl"}
TASKS = {
    task.name: task for task in (addition.TASK, fibonacci.TASK, chat_math.TASK, worked_sum.TASK, tools.TASK)
}


def is_synthetic(uri: str) -> bool:
    return uri.startswith(SCHEME)


def parse_uri(uri: str) -> tuple[str, str]:
    """(task, artefact) of a synthetic URI; ValueError names what is allowed."""
    if not is_synthetic(uri):
        raise ValueError(f"{uri!r} is not a {SCHEME} URI")
    task, _, artefact = uri[len(SCHEME) :].strip("/").partition("/")
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r} in {uri!r}; known: {', '.join(TASKS)}")
    if artefact not in ARTEFACTS:
        raise ValueError(f"unknown artefact {artefact!r} in {uri!r}; known: {', '.join(ARTEFACTS)}")
    return task, artefact


def task_for(data_path: str) -> Task:
    """The bundled task behind a `synthetic://TASK/...` data path; any other data is `ANSWER_MATCH`."""
    if not is_synthetic(data_path):
        return ANSWER_MATCH
    task, _artefact = parse_uri(data_path)
    return TASKS[task]


def resolve_uri(uri: str) -> Path:
    """The local path behind a synthetic URI, preparing the task on first use."""
    from distillery_runtime.tasks.build.prepare import prepare

    task, artefact = parse_uri(uri)
    return prepare(task) / ARTEFACTS[artefact]
