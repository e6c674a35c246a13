"""The checkpoint disk fills up mid-run, as a user sees it from `distillery run`: a real size-limited
filesystem (tmpfs, mounted by the test: it needs root, as CI runs) under the output folder's checkpoints.

The run passes its preflight (room for two checkpoints), saves one, then the test fills the disk: the next
save fails, and the run ends with one line naming the folder, the step and the reason, the complete
checkpoints untouched, no partial copy left behind, and the report written.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from distillery_runtime.checkpoints import checkpoint
from support.requirements import require_root

from tests.runtime.conftest import manifest
from tests.runtime.test_run import finish, read_records, start

pytestmark = [pytest.mark.slow, pytest.mark.local_run]


def test_a_disk_that_fills_mid_run_fails_the_save_and_keeps_the_complete_checkpoints(
    job_files, write_manifest, tmp_path
):
    require_root("mounting a size-limited tmpfs")  # a skip without root; under CI=true, a failure
    # Trainer state and the bfloat16 kept model (model/).
    per_checkpoint = checkpoint.parameter_count(job_files.student) * (checkpoint.BYTES_PER_PARAMETER + 2)
    out = tmp_path / "out"
    disk = out / "checkpoints"
    disk.mkdir(parents=True)
    size = int(2.5 * per_checkpoint) // 4096 * 4096
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
    try:
        doc = manifest(
            job_files,
            name="full",
            schedule={"steps": 6, "promptsPerStep": 4, "microBatchSize": 4, "checkpointEvery": 1},
        )
        process = start([str(write_manifest(doc)), "-o", str(out), "--no-progress"], tmp_path)
        deadline = time.monotonic() + 240
        while not checkpoint.list_complete(disk):
            assert process.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.05)
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * max(0, free - 16 * 1024))  # the disk is now full
        code, log = finish(process)
        kept = checkpoint.list_complete(disk)
        leftovers = [p.name for p in disk.iterdir() if p.name.startswith(".tmp-")]
    finally:
        if process.poll() is None:
            process.kill()
        subprocess.run(["umount", str(disk)], check=True)
    assert code == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith(f"checkpoint: {disk}: could not write checkpoint step "), last
    assert "No space left on device" in last and f"the newest complete checkpoint is {kept[-1].path}" in last
    assert kept and leftovers == []
    steps = [r["step"] for r in read_records(out / "metrics.jsonl")]
    assert steps[-1] > kept[-1].step  # the step whose save failed was trained and recorded
    assert "(stopped)" in (out / "report.md").read_text()
