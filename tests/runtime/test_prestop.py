"""The Ray head's preStop hook (`python -m distillery_runtime.prestop`): it finds the driver however it was
started, and a driver it stops finishes its step and saves a checkpoint before it exits, within the
timeout. (The hook's place in the pod: tests/operator/test_operator_render.py; in a running pod with a
kubelet: not yet, see docs/operator.md.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from distillery_runtime.run import prestop

from tests.runtime.conftest import manifest, run_env
from tests.runtime.test_run import finish, read_records, start, wait_for_step


@pytest.mark.parametrize(
    ("argv", "driver"),
    [
        (
            [
                "/opt/distillery/bin/python",
                "/opt/distillery/bin/distillery",
                "run",
                "/etc/distillery/runtime-config.json",
            ],
            True,
        ),
        (["distillery", "run", "/etc/distillery/runtime-config.json", "--ray-address", "auto"], True),
        (["python", "-m", "distillery_cli", "run", "/etc/distillery/runtime-config.json"], True),
        (["distillery", "run", "job.yaml"], False),  # a local run of a manifest
        (["python", "-m", "distillery_runtime.teachers.server", "--model", "m"], False),
        (["ray", "start", "--head", "--block"], False),
        (["bash", "-lc", "distillery run /etc/distillery/runtime-config.json"], False),  # the wrapper itself
        (["distillery", "run", "/tmp/other/runtime-config.json"], False),  # another config
    ],
)
def test_the_driver_is_found_however_it_was_started(argv: list[str], driver: bool) -> None:
    assert prestop.is_driver(argv) is driver


@pytest.mark.slow
@pytest.mark.local_run
def test_the_hook_stops_the_driver_after_its_checkpoint(job_files, tmp_path) -> None:
    # A local run stands in for the driver; the hook is pointed at its job file instead of the pod's config
    # (so that it never touches another test session's runs on this machine).
    job = tmp_path / "runtime-config.json"
    doc = manifest(
        job_files,
        name="stopme",
        schedule={"steps": 200, "promptsPerStep": 4, "microBatchSize": 4, "checkpointEvery": 0},
    )
    job.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    process = start([str(job), "-o", str(out), "--no-progress"], tmp_path)
    try:
        wait_for_step(process, out / "metrics.jsonl", 2)
        hook = subprocess.run(
            [
                *(sys.executable, "-m", "distillery_runtime.prestop", "--timeout", "120", "--no-ray-stop"),
                f"--config={job}",
            ],
            env=run_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        code, log = finish(process, timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert hook.returncode == 0, hook.stdout + hook.stderr
    assert f"driver [{process.pid}]: stopped" in hook.stdout
    assert code == 130, log[-3000:]
    done = read_records(out / "metrics.jsonl")[-1]["step"]
    assert done < 200 and (out / "checkpoints" / f"step-{done:08d}" / "COMPLETE").exists(), log[-3000:]
