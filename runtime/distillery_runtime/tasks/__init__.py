"""Bundled synthetic tasks a tiny model learns on CPU in minutes: the quick-start and the benchmarks.

`resolve_uri("synthetic://addition/teacher")` (and `/student`, `/train`, `/eval`) gives a local path,
preparing the task once (cached); `synthetic://fibonacci/...` is the long-generation task (74-134-token
traces graded on their last number), `synthetic://chat-math/...` the chat-format one (GSM8K-style `messages`
rows, Qwen-like models with Qwen's real vocabulary, graded by gsm8k), `synthetic://worked-sum/...` the
repairable one (a guess, then its working; the student an SFT checkpoint stuck copying its guess),
`synthetic://tools/...` the tool-use one (a product asked of a calculator in a multi-turn episode; the
student stopped while it still writes malformed calls).
`task_for(data_path)` is the task a job trains on (its grader is a field of the task) and `model_accuracy` a
model directory's held-out accuracy under greedy decoding.
"""

import orjson

from distillery_runtime.tasks.base import Task
from distillery_runtime.tasks.uri import SCHEME, is_synthetic, parse_uri, resolve_uri, task_for


def teacher_accuracy(teacher_model: str, eval_path: str | None) -> float | None:
    """The held-out accuracy a synthetic task's build measured for its teacher (its manifest), when the job
    evaluates on that task's eval set, so the number is on the same prompts; None for anything else."""
    if not (is_synthetic(teacher_model) and eval_path and is_synthetic(eval_path)):
        return None
    task, artefact = parse_uri(teacher_model)
    if artefact != "teacher" or parse_uri(eval_path) != (task, "eval"):
        return None
    manifest = orjson.loads((resolve_uri(teacher_model).parent / "manifest.json").read_bytes())
    return float(manifest["teacher"]["eval_accuracy"])


def model_accuracy(model_dir, rows, **kw):  # type: ignore[no-untyped-def]
    """Held-out accuracy of a saved model (lazy import: torch/transformers load only when needed)."""
    from distillery_runtime.tasks.measure.evaluate import model_accuracy as _impl

    return _impl(model_dir, rows, **kw)


__all__ = [
    "SCHEME",
    "Task",
    "is_synthetic",
    "model_accuracy",
    "parse_uri",
    "resolve_uri",
    "task_for",
    "teacher_accuracy",
]
