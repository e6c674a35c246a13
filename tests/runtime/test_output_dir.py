"""Where a run's metrics, evals and report go (`cli.output_dir`).

Found on a real node: in a cluster they went to runs/JOB under the head pod's working directory, gone with
the pod, so a retry's metrics started over and nobody could read a finished job's losses.
"""

from __future__ import annotations

from pathlib import Path

from distillery_runtime.run.cli import output_dir

from distillery.runtime_config import resolve_runtime_config
from distillery.validation import load_job

ROOT = Path(__file__).resolve().parents[2]


def test_in_a_cluster_the_output_lies_beside_the_checkpoints() -> None:
    job = load_job(ROOT / "examples" / "standalone-teacher.yaml")
    config = resolve_runtime_config(job, "ns", in_cluster=True)
    assert output_dir(config, True, None) == Path(job.spec.checkpoint.path) / "runs" / job.metadata.name
    assert output_dir(config, False, None) == Path("runs") / job.metadata.name
    assert output_dir(config, True, "/elsewhere") == Path("/elsewhere")
