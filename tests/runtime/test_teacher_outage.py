"""A teacher that stops answering mid-run, as a user sees it from `distillery run`: real Ray, a real vLLM
teacher (the session's server) behind a loopback proxy that the test stops and restarts.

- down for longer than the client's retries, then back: the run says so at once, waits, and finishes
  every step with nothing lost;
- down for good: the run saves a checkpoint of its finished steps, writes its report, and fails with one
  line naming the teacher, its endpoint and the budget.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from tests.runtime.conftest import distillery_command, manifest, run_env
from tests.runtime.test_run import finish, read_records, start
from tests.teachers.fault_proxy import FaultProxy

pytestmark = [pytest.mark.slow, pytest.mark.local_run, pytest.mark.vllm, pytest.mark.timeout(600)]

BUDGET = 24
"""spec.teacherOutageTimeoutSeconds: each scoring call retries BUDGET / 4 = 6 s, then the run waits."""


def outage_job(job_files, vllm_server, endpoint: str, name: str, student: Path | None = None) -> dict:
    """A job whose external teacher is the session's vLLM server; its student shares the teacher's
    tokenizer (the teacher's own model) unless another student is given."""
    doc = manifest(
        job_files,
        name=name,
        teachers=[
            {"name": "remote", "model": vllm_server.model, "placement": "external", "endpoint": endpoint}
        ],
        schedule={"steps": 4, "promptsPerStep": 4, "microBatchSize": 4, "checkpointEvery": 0},
        teacherOutageTimeoutSeconds=BUDGET,
    )
    doc["spec"]["student"]["model"] = str(student or vllm_server.model_dir)
    # The teacher's tiny tokenizer has a chat template; these prompts are the runtime job's raw text.
    doc["spec"]["data"]["chatTemplate"] = "none"
    return doc


async def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


async def _start(job: Path, out: Path, log: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *distillery_command(str(job), "-o", str(out), "--no-progress"),
        env=run_env(),
        stdout=log.open("wb"),
        stderr=asyncio.subprocess.STDOUT,
        cwd=job.parent,
    )


async def test_a_teacher_down_past_its_retries_is_waited_for_and_the_run_finishes(
    job_files, write_manifest, vllm_server, tmp_path
):
    proxy = await FaultProxy("127.0.0.1", int(vllm_server.url.rsplit(":", 1)[1])).start()
    job = write_manifest(outage_job(job_files, vllm_server, proxy.url, "outage-back"))
    out, log = tmp_path / "out", tmp_path / "run.log"
    process = await _start(job, out, log)
    try:
        await _wait(lambda: len(read_records(out / "metrics.jsonl")) >= 2, 300, "step 2")
        await proxy.stop()
        await _wait(lambda: "is not answering" in log.read_text(), 60, "the outage to be reported")
        assert process.returncode is None  # waiting, not failed
        await asyncio.sleep(3)
        await proxy.start()
        code = await asyncio.wait_for(process.wait(), 240)
    finally:
        if process.returncode is None:
            process.kill()
        await proxy.stop()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "teacher remote answers again after" in text
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["samples"] == 8 for r in records)  # no sample lost to the outage


def test_a_teacher_whose_server_reports_another_vocabulary_is_refused_before_step_1(
    job_files, write_manifest, vllm_server, tmp_path
):
    """The tiny student's tokenizer is not the session teacher's: the vocabulary the teacher's server reports
    shows it before any step, naming the first differing token (it was an index error inside the loss)."""
    doc = outage_job(job_files, vllm_server, vllm_server.url, "mismatch", student=job_files.student)
    out = tmp_path / "out"
    code, log = finish(start([str(write_manifest(doc)), "-o", str(out), "--no-progress"], tmp_path))
    assert code == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert re.match(
        r"teachers: spec\.teachers\[0\] \(remote\): token id \d+ is '.+' for the student but ", last
    )
    assert not read_records(out / "metrics.jsonl")


async def test_a_teacher_down_past_the_budget_checkpoints_then_fails_naming_it(
    job_files, write_manifest, vllm_server, tmp_path
):
    proxy = await FaultProxy("127.0.0.1", int(vllm_server.url.rsplit(":", 1)[1])).start()
    job = write_manifest(outage_job(job_files, vllm_server, proxy.url, "outage-gone"))
    out, log = tmp_path / "out", tmp_path / "run.log"
    process = await _start(job, out, log)
    try:
        await _wait(lambda: len(read_records(out / "metrics.jsonl")) >= 2, 300, "step 2")
        await proxy.stop()  # gone for good
        started = time.monotonic()
        code = await asyncio.wait_for(process.wait(), 240)
        waited = time.monotonic() - started
    finally:
        if process.returncode is None:
            process.kill()
    text = log.read_text()
    assert code == 2, text[-3000:]
    steps = [r["step"] for r in read_records(out / "metrics.jsonl")]
    done = steps[-1]
    assert done >= 2 and waited < BUDGET + 60
    # Nothing finished is lost: a checkpoint of the last finished step, and the report.
    assert (out / "checkpoints" / f"step-{done:08d}" / "COMPLETE").exists(), text[-3000:]
    assert "(stopped)" in (out / "report.md").read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith("teachers: teacher remote unreachable for") and proxy.url in last
    assert f"outage budget of {BUDGET} s" in last
