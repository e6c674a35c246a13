"""The RayJob entrypoint: `distillery run /etc/distillery/runtime-config.json` in a cluster.

What a cluster provides is real: a Ray cluster started beforehand (the run joins it with --ray-address,
as the RayJob's head does), the session's vLLM teacher server as the standalone teacher's Service
(compact endpoint), a Prometheus scrape of the trainer's /metrics during the run, and the real
kube-apiserver receiving the status patches. (The pods themselves are not run here.)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from distillery_runtime.run.workers import free_port

from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, StatusTarget, TeacherProtocol
from distillery.validation import parse_job
from tests.runtime.conftest import distillery_command, run_env

sys.path.insert(0, str(Path(__file__).parent))

from harness import Installation, yaml_stream

RAY_HOLDER = (
    "import ray, sys, time\n"
    "ray.init(address='local', num_cpus=4, include_dashboard=False)\n"
    "print(ray.get_runtime_context().gcs_address, flush=True)\n"
    "time.sleep(1e6)\n"
)


async def _scrape(url: str) -> str:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return await r.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return ""


async def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


@pytest.mark.slow
async def test_cluster_entrypoint_joins_ray_serves_metrics_and_patches_status(
    vllm_server, tmp_path, installation: Installation, namespace: str
):
    student = tmp_path / "student"
    shutil.copytree(vllm_server.model_dir, student)  # same tokenizer as the session's teacher
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"the student {i} and the teacher"}) + "\n" for i in range(16))
    )
    job = parse_job(
        {
            "apiVersion": "distillery.io/v1alpha1",
            "kind": "DistillationJob",
            "metadata": {"name": "demo"},
            "spec": {
                "student": {
                    "model": str(student), "precision": "float32",
                    "rollout": {"maxNewTokens": 8, "samplesPerPrompt": 2}, "optimizer": {"lr": 1e-4},
                    "pool": {"workers": 1, "gpusPerWorker": 0},
                },
                "teachers": [{"name": "teacher", "model": str(vllm_server.model_dir)}],
                "data": {"train": {"path": str(data)}, "maxPromptTokens": 32, "chatTemplate": "none"},
                "loss": {"mode": "forward_kl_topk", "topK": 8},
                "schedule": {"steps": 3, "promptsPerStep": 4, "microBatchSize": 8, "checkpointEvery": 2},
                "checkpoint": {"path": str(tmp_path / "checkpoints")},
                "teacherReadyTimeoutSeconds": 60,
            },
        }
    )  # fmt: skip
    metrics_port = free_port()
    config = RuntimeConfig(
        job_name="demo",
        namespace="test",
        spec=job.spec,
        teachers=[
            ResolvedTeacher(
                name="teacher", placement="standalone", protocol=TeacherProtocol.COMPACT, endpoints=[vllm_server.url],
                served_model_name=vllm_server.model, max_logprobs=vllm_server.max_logprobs,
                max_model_len=vllm_server.max_model_len,
            )
        ],
        status_target=StatusTarget(namespace=namespace, name="demo"),
        metrics_port=metrics_port,
    )  # fmt: skip
    config_path = tmp_path / "runtime-config.json"
    config_path.write_text(config.model_dump_json(by_alias=True))

    # The holder's cluster and the run share one setting: Ray's token auth is off for this loopback
    # cluster (in KubeRay the entrypoint runs in the head pod, which carries the cluster's token).
    env = {**run_env(), "RAY_AUTH_MODE": "disabled"}
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RAY_HOLDER, env=env, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    try:
        address = (await asyncio.wait_for(holder.stdout.readline(), 120)).decode().strip()
        manifest = job.model_dump(by_alias=True, mode="json", exclude_none=True)
        manifest["metadata"] = {"name": "demo", "namespace": namespace}
        installation.admin("apply", "-f", "-", input=yaml_stream([manifest]))
        # The operator's field, as the operator writes it (no operator runs here).
        installation.admin(
            "patch", "dj", "demo", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", '{"status": {"phase": "Running"}}',
        )  # fmt: skip
        run = await asyncio.create_subprocess_exec(
            *distillery_command(
                str(config_path), "--ray-address", address, "-o", str(tmp_path / "out"), "--no-progress"
            ),
            # Admin: which account may patch the status is test_rbac_on_server.py's business.
            env={**env, "KUBECONFIG": str(installation.plane.admin_kubeconfig)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        try:
            scraped = await wait_for(lambda: _metric_after_first_step(url), 300, "a scrape after step 1")
        except AssertionError:
            run.kill()
            out, _ = await run.communicate()
            raise AssertionError(out.decode(errors="replace")[-6000:]) from None
        out, _ = await asyncio.wait_for(run.communicate(), 300)
        log = out.decode(errors="replace")
        assert run.returncode == 0, log
        assert 'distillery_runtime_teacher_samples_total{teacher="teacher"}' in scraped
        assert "distillery_runtime_step_phase_duration_seconds_bucket" in scraped

        status = installation.get("distillationjob", "demo", namespace)["status"]
        assert status["phase"] == "Running"
        assert status["progress"]["step"] == 3 and status["progress"]["totalSteps"] == 3
        assert status["lastCheckpoint"]["step"] == 3
        assert Path(status["lastCheckpoint"]["path"]).parent == tmp_path / "checkpoints"
    finally:
        if holder.returncode is None:
            os.killpg(holder.pid, signal.SIGTERM)
            await holder.wait()


async def _metric_after_first_step(url: str) -> str | None:
    text = await _scrape(url)
    for line in text.splitlines():
        if line.startswith("distillery_runtime_step ") and float(line.split()[1]) >= 1:
            return text
    return None
