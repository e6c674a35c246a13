"""The end-of-run report: `report.md` plus PNG plots of loss, KL and eval accuracy over steps.

`references` are accuracies the student is climbing toward or measured against (the teacher's held-out
accuracy, an SFT baseline's): dashed lines on the accuracy plot, and named in the headline. The headline
names the grader the evaluations were graded by (`grader` in each eval.jsonl entry: an accuracy of 0% by
exact match says something else than one by gsm8k).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        if isinstance(value, int | float):
            xs.append(int(r["step"]))
            ys.append(float(value))
    return xs, ys


def plot(
    path: Path,
    title: str,
    ylabel: str,
    series: dict[str, tuple[list[int], list[float]]],
    hlines: dict[str, float] | None = None,
) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(xs for xs, _ in series.values()):
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
    for (label, value), color in zip(
        (hlines or {}).items(), ("tab:green", "tab:red", "tab:gray"), strict=False
    ):
        ax.axhline(value, linestyle="--", linewidth=1, color=color, label=f"{label} ({value:.1%})")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) + len(hlines or {}) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def graded_evals(evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evals that measured an accuracy (data with no reference answers has only KL and lengths)."""
    return [e for e in evals if e.get("eval_accuracy") is not None]


def accuracy_label(evals: list[dict[str, Any]]) -> str:
    """`gsm8k accuracy`: what the evaluations measured, named by their grader (the last one's: a resumed
    run's earlier entries may predate the field)."""
    grader = evals[-1].get("grader") if evals else None
    return f"{grader} accuracy" if grader else "accuracy"


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def write_report(
    out_dir: Path,
    *,
    job_name: str,
    records: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    summary: dict[str, Any],
    references: dict[str, float] | None = None,
    model: str | None = None,
    model_dtype: str | None = None,
) -> Path:
    """Write report.md and its plots into out_dir; returns the report's path.

    `references`: {label: held-out accuracy}, e.g. {"teacher": 0.99, "SFT baseline": 0.8}. `model`: the
    final model's folder (`final/`, a finished run's), in `model_dtype`."""
    references = references or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    p = plot(out_dir / "loss.png", "Distillation loss", "loss", {"loss": _series(records, "loss")})
    plots.append(("Loss", p))
    kl_series = {"all": _series(records, "kl")}
    teachers = sorted({name for r in records for name in r.get("kl_per_teacher", {})})
    for name in teachers:
        kl_series[f"{name} (on-policy k3)"] = _series(
            [{"step": r["step"], "v": r["kl_per_teacher"].get(name)} for r in records], "v"
        )
    plots.append(("KL", plot(out_dir / "kl.png", "KL(student || teacher)", "nats / token", kl_series)))
    plots.append(
        (
            "Eval accuracy",
            plot(
                out_dir / "eval_accuracy.png",
                "Held-out accuracy",
                accuracy_label(evals),
                {"student": _series(evals, "eval_accuracy")},
                references,
            ),
        )
    )
    if any("episode/turns_mean" in r for r in records):
        # A tool-using student's episodes: how many turns it takes, and how often it misuses its tool.
        episodes = {
            "turns per episode": _series(records, "episode/turns_mean"),
            "tool calls per episode": _series(records, "episode/tool_calls_mean"),
            "tool errors (step total)": _series(records, "episode/tool_errors"),
        }
        plots.append(("Episodes", plot(out_dir / "episodes.png", "Episodes", "per step", episodes)))
    lines = [f"# Distillation report: {job_name}", ""]
    graded = graded_evals(evals)
    if graded:
        first, last = graded[0], graded[-1]
        lines += [
            f"**Held-out {accuracy_label(evals)}: {first['eval_accuracy']:.1%} at step {first['step']} -> "
            f"{last['eval_accuracy']:.1%} at step {last['step']}** "
            f"({last['eval_accuracy'] - first['eval_accuracy']:+.1%}, {last.get('n', '?')} prompts, greedy)"
            + "".join(f"; {label}: {value:.1%}" for label, value in references.items()),
            "",
        ]
    if model:
        lines += [f"**Model:** `{model}` ({model_dtype}, Hugging Face format): `vllm serve {model}`", ""]
    step_times = [r["time/step_s"] for r in records]
    lines += ["## Summary", "", "| | |", "|---|---|"]
    for key, value in summary.items():
        lines.append(f"| {key} | {value} |")
    if records:
        lines += [
            f"| steps in this report | {len(records)} |",
            f"| median step time | {_median(step_times):.3f} s |",
            f"| median tokens/s | {_median([r['tokens_per_s'] for r in records]):.1f} |",
            f"| final loss | {records[-1].get('loss')} |",
        ]
        lines += [
            "",
            "## Where a step's time goes (median seconds)",
            "",
            "| rollout | teacher | train | sync | step |",
            "|---|---|---|---|---|",
        ]
        phases = [
            _median([r[f"time/{k}_s"] for r in records])
            for k in ("rollout", "teacher", "train", "sync", "step")
        ]
        lines.append("| " + " | ".join(f"{v:.3f}" for v in phases) + " |")
    if evals:
        lines += [
            "",
            "## Evaluations",
            "",
            "| step | accuracy | KL per teacher | mean tokens | prompts |",
            "|---|---|---|---|---|",
        ]
        lines += [_eval_row(e) for e in evals]
        lines += ["", "What the student wrote at each eval: `samples.jsonl`."]
    lines += [""]
    for title, path in plots:
        if path is not None:
            lines += [f"## {title}", "", f"![{title}]({path.name})", ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report


def _eval_row(entry: dict[str, Any]) -> str:
    accuracy = entry.get("eval_accuracy")
    kl = ", ".join(f"{name} {value:.3f}" for name, value in entry.get("kl_per_teacher", {}).items())
    length = entry.get("response_length_mean")
    return (
        f"| {entry['step']} | {'-' if accuracy is None else f'{accuracy:.3f}'} | {kl or '-'} | "
        f"{'-' if length is None else f'{length:.1f}'} | {entry.get('n', '')} |"
    )
