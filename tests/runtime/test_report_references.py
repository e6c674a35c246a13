"""The report shows the accuracy the student climbs toward: the teacher's (and a baseline's) as lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distillery_runtime import tasks
from distillery_runtime.observe.report import write_report

EVALS = [
    {"step": 0, "grader": "gsm8k", "eval_accuracy": 0.15, "n": 512},
    {"step": 10, "grader": "gsm8k", "eval_accuracy": 0.6, "n": 512},
]


def test_the_headline_names_the_references_and_the_plot_draws_them(tmp_path, monkeypatch):
    drawn = {}
    import matplotlib.axes

    original = matplotlib.axes.Axes.axhline

    def axhline(self, y=0, *args, **kw):
        drawn[kw["label"]] = y
        return original(self, y, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", axhline)
    report = write_report(
        tmp_path,
        job_name="j",
        records=[],
        evals=EVALS,
        summary={},
        references={"teacher": 0.994, "SFT baseline": 0.7},
    )
    text = report.read_text()
    assert "15.0% at step 0 -> 60.0% at step 10" in text
    assert "; teacher: 99.4%; SFT baseline: 70.0%" in text
    assert drawn == {"teacher (99.4%)": 0.994, "SFT baseline (70.0%)": 0.7}
    assert (tmp_path / "eval_accuracy.png").is_file()


def test_the_headline_names_the_grader_and_without_references_nothing_else(tmp_path):
    text = write_report(tmp_path, job_name="j", records=[], evals=EVALS, summary={}).read_text()
    headline = (
        "**Held-out gsm8k accuracy: 15.0% at step 0 -> 60.0% at step 10** (+45.0%, 512 prompts, greedy)\n"
    )
    assert headline in text and "teacher:" not in text


def test_evaluations_from_before_the_grader_was_recorded_name_none(tmp_path):
    evals = [{k: v for k, v in e.items() if k != "grader"} for e in EVALS]
    text = write_report(tmp_path, job_name="j", records=[], evals=evals, summary={}).read_text()
    assert "**Held-out accuracy: 15.0% at step 0" in text


@pytest.mark.parametrize(
    ("teacher", "eval_path"),
    [
        ("/models/teacher", "synthetic://addition/eval"),
        ("synthetic://addition/teacher", "/data/eval.jsonl"),
        ("synthetic://addition/teacher", None),
        ("synthetic://addition/student", "synthetic://addition/eval"),
    ],
)
def test_the_teacher_line_only_when_it_was_measured_on_the_same_prompts(teacher, eval_path, monkeypatch):
    monkeypatch.setattr(tasks, "resolve_uri", lambda _uri: pytest.fail("nothing to read"))
    assert tasks.teacher_accuracy(teacher, eval_path) is None


def test_the_teacher_line_comes_from_the_prepared_task(tmp_path, monkeypatch):
    (tmp_path / "teacher").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps({"teacher": {"eval_accuracy": 0.98828125}}))
    monkeypatch.setattr(tasks, "resolve_uri", lambda uri: tmp_path / "teacher")
    assert tasks.teacher_accuracy("synthetic://addition/teacher", "synthetic://addition/eval") == 0.98828125


def test_the_run_passes_the_teacher_line_and_survives_a_missing_manifest(monkeypatch):
    from distillery_runtime.run.cli import load_config, report_references

    example = Path(__file__).resolve().parents[2] / "examples" / "local-addition.yaml"
    config, _in_cluster = load_config(str(example))
    seen = []

    def measured(model, eval_path):
        seen.append((model, eval_path))
        return 0.99

    monkeypatch.setattr(tasks, "teacher_accuracy", measured)
    assert report_references(config) == {"teacher": 0.99}
    assert seen == [("synthetic://addition/teacher", "synthetic://addition/eval")]

    def missing(_model, _eval_path):
        raise FileNotFoundError("manifest.json")

    monkeypatch.setattr(tasks, "teacher_accuracy", missing)
    assert report_references(config) == {}


def test_no_teacher_line_when_the_job_grades_by_another_grader(tmp_path, monkeypatch):
    import yaml
    from distillery_runtime.run.cli import load_config, report_references

    example = Path(__file__).resolve().parents[2] / "examples" / "local-addition.yaml"
    doc = yaml.safe_load(example.read_text())
    doc["spec"]["data"]["grader"] = {"name": "gsm8k"}  # the teacher was measured by the task's own grader
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(tasks, "teacher_accuracy", lambda _model, _eval_path: 0.99)
    assert report_references(load_config(str(path))[0]) == {}


def test_the_teacher_line_when_the_job_names_the_grader_the_task_grades_with(monkeypatch):
    from distillery_runtime.run.cli import load_config, report_references

    # chat-math's build measured its teacher with gsm8k, the grader the example names.
    example = Path(__file__).resolve().parents[2] / "examples" / "chat-math.yaml"
    monkeypatch.setattr(tasks, "teacher_accuracy", lambda _model, _eval_path: 0.97)
    assert report_references(load_config(str(example))[0]) == {"teacher": 0.97}
