"""`distillery run` end to end, as a user runs it: real Ray, real vLLM engines, real checkpoints.

- validation errors: all printed, before any work;
- a standalone teacher (our teacher server on loopback) with one-step-off rollout, stopped by Ctrl-C
  (checkpoint + report);
- SIGKILL mid-step, resume: the same steps and the same losses as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import orjson
import pytest
import torch
from distillery_runtime.checkpoints import checkpoint
from transformers import AutoModelForCausalLM

from distillery.model_shapes import resolve_shape
from distillery.plan import resolve
from distillery.validation import parse_job
from tests.runtime.conftest import distillery_command, manifest, run_env


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def wait_for_step(process: subprocess.Popen, metrics: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in read_records(metrics)):
            return
        if process.poll() is not None:
            out = process.stdout.read().decode(errors="replace") if process.stdout else ""
            raise AssertionError(f"run exited with {process.returncode} before step {step}:\n{out[-4000:]}")
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    # Own session: a SIGKILL of the whole group is what a node or pod failure does to the run.
    return subprocess.Popen(
        distillery_command(*args),
        cwd=cwd,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def session_pids(session: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Fields after the command's closing parenthesis: state, ppid, pgrp, session.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[3]) == session and fields[0] != "Z":  # a zombie has finished already
                pids.append(int(entry.name))
    return pids


def kill_session(session: int, timeout: float = 30) -> None:
    """SIGKILL every process of a session at once, as a node or pod failure does.

    The run's group alone is not enough: Ray starts each worker in a process group of its own (same session),
    and a worker that outlives the driver could still finish a checkpoint after the "crash".
    """
    deadline = time.monotonic() + timeout
    while pids := session_pids(session):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # gone meanwhile
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"session {session} still has processes {pids}"
        time.sleep(0.05)


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out.decode(errors="replace")


def run_quick(job: Path, out_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`distillery run JOB -o OUT_DIR ARGS` for a job that must end before it starts anything (it fails
    first, or has nothing left to run): not even Ray, whose session would appear under the run's own
    `RAY_TMPDIR` (short: Ray's socket paths are bounded)."""
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as ray_tmp:
        result = subprocess.run(
            distillery_command(str(job), "-o", str(out_dir), *args),
            env={**run_env(), "RAY_TMPDIR": ray_tmp},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert not os.listdir(ray_tmp), f"Ray was started: {os.listdir(ray_tmp)}"
    return result


def test_invalid_manifest_reports_every_problem_before_any_work(job_files, write_manifest, tmp_path):
    doc = manifest(job_files, name="bad")
    doc["spec"]["loss"] = {"mode": "jsd", "topK": 0}
    doc["spec"]["teachers"][0]["placement"] = "external"  # external without an endpoint
    doc["spec"]["schedule"]["microBatchSize"] = 0
    out_dir = tmp_path / "out"
    result = run_quick(write_manifest(doc), out_dir)
    assert result.returncode == 1
    for path in ("spec.loss.topK", "spec.teachers[0].endpoint", "spec.schedule.microBatchSize"):
        assert path in result.stderr
    assert not out_dir.exists()  # nothing was started or written


def test_overlong_prompts_fail_before_any_process_starts(job_files, write_manifest, tmp_path):
    doc = manifest(job_files, name="long")
    doc["spec"]["data"]["maxPromptTokens"] = 3
    result = run_quick(write_manifest(doc), tmp_path / "o")
    assert result.returncode == 1
    assert "longer than data.maxPromptTokens=3" in result.stderr and "row 0" in result.stderr
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_a_malformed_data_file_is_one_line_and_exit_1_before_any_process_starts(
    job_files, write_manifest, tmp_path
):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(job_files.train.read_text().splitlines()[0] + "\n[1, 2]\n")
    doc = manifest(job_files, name="malformed")
    doc["spec"]["data"]["train"]["path"] = str(bad)
    result = run_quick(write_manifest(doc), tmp_path / "o")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"data: {bad}:2: each line must be a JSON object with the data fields, not a list"
    ]
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_an_environment_that_does_not_import_is_one_line_and_exit_1_before_the_first_step(
    job_files, write_manifest, tmp_path
):
    doc = manifest(job_files, name="environment")
    doc["spec"]["environment"] = {"module": "no_such_tools.calc:Calculator"}
    path = write_manifest(doc)
    result = run_quick(path, tmp_path / "o")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"{path}: spec.environment.module: cannot import 'no_such_tools.calc:Calculator' in the runtime: "
        "ModuleNotFoundError: No module named 'no_such_tools'"
    ]
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_a_grader_that_does_not_import_is_one_line_and_exit_1_before_the_first_step(
    job_files, write_manifest, tmp_path
):
    doc = manifest(job_files, name="grader")
    doc["spec"]["data"]["grader"] = {"name": "module", "function": "no_such_graders.mine:grade"}
    path = write_manifest(doc)
    result = run_quick(path, tmp_path / "o")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"{path}: spec.data.grader.function: cannot import 'no_such_graders.mine:grade' in the runtime: "
        "ModuleNotFoundError: No module named 'no_such_graders'"
    ]
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_a_fresh_run_into_a_folder_with_checkpoints_refuses_and_deletes_nothing(
    job_files, write_manifest, tmp_path
):
    from distillery_runtime.checkpoints import checkpoint
    from distillery_runtime.run.loop.state import earlier_run_refusal

    out = tmp_path / "o"
    earlier = out / "checkpoints" / "step-00000004"
    earlier.mkdir(parents=True)
    (earlier / checkpoint.STATE_FILE).write_text("{}")
    assert earlier_run_refusal(out, resume=False, overwrite=False) is None  # torn: not a checkpoint
    (earlier / checkpoint.MARKER).write_text("")
    result = run_quick(write_manifest(manifest(job_files, name="again")), out)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"{tmp_path / 'again.yaml'}: {out / 'checkpoints'} holds 1 checkpoint(s) of an earlier run (newest: "
        "step-00000004): pass --resume to continue from it, or --overwrite to start fresh and delete them"
    ]
    assert (earlier / checkpoint.MARKER).exists() and not (out / "metrics.jsonl").exists()
    assert earlier_run_refusal(out, resume=True, overwrite=False) is None
    assert earlier_run_refusal(out, resume=False, overwrite=True) is None


def test_a_checkpoint_folder_that_cannot_be_written_fails_before_the_first_step(
    job_files, write_manifest, tmp_path
):
    out = tmp_path / "o"
    out.mkdir()
    (out / "checkpoints").write_text("a file where the checkpoints folder would be")
    result = run_quick(write_manifest(manifest(job_files, name="nowhere")), out)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"{tmp_path / 'nowhere.yaml'}: --output: {out / 'checkpoints'} is not writable"
    )
    assert not (out / "metrics.jsonl").exists()


def test_a_cluster_run_refuses_another_runs_checkpoints_before_any_process_starts(job_files, tmp_path):
    """The job was deleted and made again (a new uid) over the same checkpoint.path: the new run neither
    resumes the old run's checkpoints unasked nor writes (and prunes) beside them."""
    from distillery_runtime.checkpoints import checkpoint
    from distillery_runtime.run.workers import free_port

    from distillery.runtime_config import resolve_runtime_config
    from distillery.validation import parse_job

    root = tmp_path / "checkpoints"
    old = root / "step-00000050"
    old.mkdir(parents=True)
    (old / checkpoint.STATE_FILE).write_text('{"step": 50, "position": 200, "version": 50, "run": "uid-old"}')
    (old / checkpoint.MARKER).write_text("50")
    doc = manifest(job_files, name="again", checkpoint={"path": str(root)})
    doc["metadata"]["uid"] = "uid-new"
    config = resolve_runtime_config(parse_job(doc), "ns", in_cluster=True).model_copy(
        update={"status_target": None, "metrics_port": free_port()}
    )
    path = tmp_path / "runtime-config.json"
    path.write_text(config.model_dump_json(by_alias=True))
    result = run_quick(path, tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"{path}: spec.checkpoint.path: {root} holds 1 checkpoint(s) of another run of this job (job uid "
        "uid-old, newest step-00000050); set checkpoint.resume: required to continue from it, or point "
        "checkpoint.path at a new folder (they are never deleted)"
    ]
    assert (old / checkpoint.MARKER).exists()


def test_a_pvc_location_that_is_not_mounted_fails_before_any_process_starts(
    job_files, write_manifest, tmp_path
):
    doc = manifest(job_files, name="pvc")
    doc["spec"]["data"]["train"]["path"] = "pvc://datasets/train.jsonl"
    result = run_quick(write_manifest(doc), tmp_path / "o")
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "pvc://datasets/train.jsonl: nothing at" in result.stderr and "DISTILLERY_PVC_ROOT" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_asking_for_more_gpus_than_the_machine_has_fails_at_once(job_files, write_manifest, tmp_path):
    from distillery_runtime.run.local import visible_gpus

    # Without the check, Ray keeps the trainer pending forever, waiting for GPUs this machine lacks.
    doc = manifest(job_files, name="gpus")
    doc["spec"]["student"]["pool"] = {"workers": 1, "gpusPerWorker": len(visible_gpus()) + 1}
    result = run_quick(write_manifest(doc), tmp_path / "o")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "spec.student.pool.gpusPerWorker" in result.stderr and "gpusPerWorker: 0" in result.stderr
    assert not (tmp_path / "o").exists()  # nothing was started or written


@pytest.mark.slow
@pytest.mark.local_run
def test_standalone_teacher_with_one_step_off_stops_cleanly_on_ctrl_c(job_files, write_manifest, tmp_path):
    doc = manifest(
        job_files,
        name="standalone",
        teachers=[
            {
                "name": "teacher",
                "model": str(job_files.teacher),
                "placement": "standalone",
                # vLLM, not the CPU forward a local run picks by default: this is the server's test
                "inference": {"dtype": "float32", "engine": "vllm"},
            }
        ],
        loss={"mode": "k3"},
        schedule={
            "steps": 6,
            "promptsPerStep": 4,
            "microBatchSize": 4,
            "checkpointEvery": 0,
            "evalEvery": 1,
            "oneStepOff": True,
        },
        # A cluster's setting (no claim: the pods' emptyDir); a local run writes to --output all the same.
        checkpoint={"ephemeral": True},
    )
    path, out = write_manifest(doc), tmp_path / "out"
    process = start([str(path), "-o", str(out), "--no-progress"], tmp_path)
    wait_for_step(process, out / "metrics.jsonl", 2)
    os.kill(process.pid, signal.SIGINT)  # Ctrl-C: finish the step, checkpoint, report
    code, log = finish(process)
    assert code == 130, log
    records = read_records(out / "metrics.jsonl")
    stopped_at = records[-1]["step"]
    assert [r["step"] for r in records] == list(range(1, stopped_at + 1)) and 2 <= stopped_at < 6
    assert (out / "checkpoints" / f"step-{stopped_at:08d}" / "COMPLETE").exists(), log
    assert (out / "report.md").exists() and "(stopped)" in (out / "report.md").read_text()
    # One-step-off: step 1 trains on samples of the initial weights, step 2 on samples drawn while
    # step 1 trained - one optimizer step old.
    assert records[0]["staleness"] == 0 and records[1]["staleness"] == 1
    assert all(r["samples_per_teacher"] == {"teacher": 8} for r in records)
    assert all(r["time/rollout_s"] > 0 and r["time/train_s"] > 0 and r["time/sync_s"] > 0 for r in records)
    # Generation metrics of each step; the rollout engine's log-probs are the trainer's own (float32 on CPU)
    # at step 1, the samples of later steps are one optimizer step stale.
    for r in records:
        assert 0 < r["rollout/response_length_mean"] <= r["rollout/response_length_max"] <= 6
        assert 0.0 <= r["rollout/truncated_fraction"] <= 1.0 and r["entropy"] > 0
    # The rollout returns its log-probs on step 1 and every 10th (the k3 loss does not read them): the gap is
    # measured there and nowhere else.
    gaps = [r["step"] for r in records if r["logprob_gap_mean"] is not None]
    assert gaps == [1], gaps
    assert 0 <= records[0]["logprob_gap_mean"] <= records[0]["logprob_gap_max"]
    assert records[0]["logprob_gap_mean"] < 1e-3 and records[0]["logprob_gap_max"] < 1e-2, records[0]
    evals = read_records(out / "eval.jsonl")
    assert evals[0]["step"] == 0 and all(0.0 <= e["eval_accuracy"] <= 1.0 for e in evals)
    assert all(e["kl_per_teacher"]["teacher"] >= 0 and e["response_length_mean"] > 0 for e in evals)
    samples = read_records(out / "samples.jsonl")
    assert {s["step"] for s in samples} == {e["step"] for e in evals}
    assert samples[0]["prompt"] and samples[0]["kl"]["teacher"] >= 0 and samples[0]["grade"] in (0.0, 1.0)
    assert {e["grader"] for e in evals} == {"exact"}  # data.grader auto on a jsonl file
    report = (out / "report.md").read_text()
    assert "Held-out exact accuracy" in report and "| rollout | teacher | train | sync | step |" in report
    for png in ("loss.png", "kl.png", "eval_accuracy.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The checkpointed student is a Hugging Face checkpoint, in checkpoint.modelDtype (bfloat16); a stopped
    # run has no final model.
    kept = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / f"step-{stopped_at:08d}" / "model")
    assert kept.dtype == torch.bfloat16
    assert not (out / "checkpoints" / "final").exists() and "**Model:**" not in report


@pytest.mark.slow
@pytest.mark.local_run
@pytest.mark.parametrize(
    "engine",
    [
        # The rollout and the colocated teacher in the trainer's process (the plan's local float32 path): the
        # engine samples with the module the resume loads, at the version the checkpoint restores. A vLLM
        # rollout engine's resume (its weights and version restored from the checkpoint, the same losses)
        # is the node scenario's killed head (tests/workloads/test_scenarios_on_node.py); its three runs
        # here cost 7-9 minutes of the suite for what the checkpoint's side already shows.
        "transformers",
    ],
)
def test_sigkill_mid_step_then_resume_matches_an_uninterrupted_run(
    engine, job_files, write_manifest, tmp_path
):
    # lambda = 0.5: a fixed coin per seed and step picks the steps that train on the dataset's responses.
    steps = 20  # a tiny step takes ~0.05 s: a kill late by 16 of them still lands before the run ends
    doc = manifest(
        job_files,
        name="killme",
        loss={"mode": "forward_kl_topk", "topK": 4, "onPolicyFraction": 0.5},
        schedule={"steps": steps, "promptsPerStep": 4, "microBatchSize": 2, "checkpointEvery": 2},
        # The operator's claim, a cluster's setting: a local run writes to --output all the same.
        checkpoint={"size": "1Gi", "storageClassName": "nfs-rwx", "deleteWithJob": True},
    )
    doc["spec"]["student"]["rollout"]["engine"] = engine
    doc["spec"]["data"]["responseField"] = "response"
    path = write_manifest(doc)
    # The run's own plan (as `Loop` makes it): where the rollout engine and the teacher live.
    plan = resolve(parse_job(doc).spec, local_gpus=0, student=resolve_shape(str(job_files.student)))
    assert plan.rollout.in_trainer is (engine == "transformers")
    assert plan.rollout.decode_threads == (1 if engine == "transformers" else None)  # a tiny CPU student
    assert plan.teachers_in_trainer == ({"teacher"} if engine == "transformers" else set())

    reference = tmp_path / "reference"
    code, log = finish(start([str(path), "-o", str(reference), "--no-progress"], tmp_path))
    assert code == 0, log

    out = tmp_path / "interrupted"
    process = start([str(path), "-o", str(out), "--no-progress"], tmp_path)
    wait_for_step(process, out / "metrics.jsonl", 3)
    kill_session(process.pid)  # at once: inside step 4, or a few steps on where the host is loaded
    process.wait(timeout=30)
    assert max(r["step"] for r in read_records(out / "metrics.jsonl")) < steps
    newest = checkpoint.latest(out / "checkpoints")
    assert newest is not None and newest.step in range(2, steps, 2)

    code, log = finish(start([str(path), "-o", str(out), "--no-progress", "--resume"], tmp_path))
    assert code == 0, log
    assert "resuming from" in log and checkpoint.step_dir_name(newest.step) in log

    expected, got = read_records(reference / "metrics.jsonl"), read_records(out / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    assert [r["on_policy"] for r in got] == [r["on_policy"] for r in expected]
    assert {r["on_policy"] for r in got} == {True, False}  # both kinds of step are resumed
    assert all(r["generated_tokens"] == 0 for r in got if not r["on_policy"])
    for a, b in zip(expected, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-7), (a["step"], a["loss"], b["loss"])
        assert b["response_tokens"] == a["response_tokens"]

    # The finished run keeps its last step's model as final/ (the same files), named in the report and log.
    root = out / "checkpoints"
    final, last = root / checkpoint.FINAL_DIR, root / checkpoint.step_dir_name(steps) / checkpoint.MODEL_DIR
    assert checkpoint.read_final(root)["step"] == steps
    assert all(os.path.samefile(final / f.name, f) for f in last.iterdir())
    assert f"**Model:** `{final}` (bfloat16" in (out / "report.md").read_text()
    assert f"model: {final} (bfloat16" in log

    # Once more on the finished run (a driver retried after its last step): nothing starts, not even Ray
    # (its session would appear under the run's own RAY_TMPDIR), and the run keeps its model and records.
    published = (final / "config.json").stat().st_mtime_ns
    again = run_quick(path, out, "--no-progress", "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"already finished at step {steps} of {steps}: nothing to run" in again.stdout
    assert f"model: {final} (bfloat16" in again.stdout
    assert read_records(out / "metrics.jsonl") == got
    assert (final / "config.json").stat().st_mtime_ns == published
    assert f"**Model:** `{final}` (bfloat16" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.local_run
def test_sigterm_while_waiting_for_teachers_ends_the_run_at_once(job_files, write_manifest, tmp_path):
    """A pod deleted or preempted while its run waits for teachers: the driver stops now, not once the
    teachers answer (its preStop hook waited out the pod's 600 s grace period for one, seen on the node)."""
    from distillery_runtime.run.workers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    teacher = {"name": "teacher", "model": "t", "placement": "external", "endpoint": dead}
    doc = manifest(job_files, name="waiting", teachers=[teacher], teacherReadyTimeoutSeconds=900)
    out = tmp_path / "out"
    process = start([str(write_manifest(doc)), "-o", str(out), "--no-progress"], tmp_path)
    assert process.stdout is not None
    seen = []
    for line in iter(process.stdout.readline, b""):
        seen.append(line.decode(errors="replace"))
        if seen[-1].startswith("waiting up to 900 s for teachers: teacher at http://127.0.0.1:"):
            break
    else:
        raise AssertionError(f"the run ended before it waited for its teacher: {''.join(seen)[-3000:]}")
    process.send_signal(signal.SIGTERM)
    try:
        # Far below the 900 s wait: the run's own stop (components and Ray) takes seconds.
        code, log = finish(process, timeout=120)
    finally:
        if process.poll() is None:
            kill_session(process.pid)
    assert code == 130, log[-3000:]
    assert "interrupt: stopped while starting, before step 1; nothing to save" in log, log[-3000:]
    assert "teachers ready" not in log and not read_records(out / "metrics.jsonl")
    assert checkpoint.latest(out / "checkpoints") is None


async def test_waiting_for_teachers_is_bounded_and_names_the_missing_ones(job_files):
    from distillery_runtime.run.local import TeachersNotReady, wait_for_teachers
    from distillery_runtime.run.workers import free_port

    from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, TeacherProtocol
    from distillery.validation import parse_job

    job = parse_job(manifest(job_files))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    teacher = ResolvedTeacher(
        name="teacher", placement="external", protocol=TeacherProtocol.OPENAI, endpoints=[dead],
        served_model_name="t", max_logprobs=4, max_model_len=64,
    )  # fmt: skip
    config = RuntimeConfig(job_name="tiny", spec=job.spec, teachers=[teacher])
    started = time.monotonic()
    with pytest.raises(
        TeachersNotReady, match=r"teachers not ready after 2 s: teacher at http://127\.0\.0\.1"
    ):
        await wait_for_teachers(config, timeout=2.0, interval=0.2)
    assert time.monotonic() - started < 10


def test_load_config_reads_a_manifest_or_a_resolved_cluster_config(job_files, write_manifest, tmp_path):
    from distillery_runtime.run.cli import load_config

    from distillery.runtime_config import resolve_runtime_config
    from distillery.validation import parse_job

    path = write_manifest(manifest(job_files, name="both"))
    local_config, in_cluster = load_config(str(path))
    assert not in_cluster and local_config.status_target is None and local_config.job_name == "both"

    resolved = resolve_runtime_config(parse_job(manifest(job_files, name="both")), "team-a", in_cluster=True)
    json_path = tmp_path / "runtime-config.json"
    json_path.write_text(resolved.model_dump_json(by_alias=True))
    cluster_config, in_cluster = load_config(str(json_path))
    assert in_cluster and cluster_config.status_target.namespace == "team-a"
    assert cluster_config.teachers[0].protocol.value == "in_process"
