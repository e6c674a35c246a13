"""What the refactor of issue 15 must not change, as text: the CRD, every object `distillery render` and the
operator make for the examples and tests/golden/variants.yaml, and the local launcher's decisions (runtime
config, GPU placement, teacher server commands).

`python tests/golden/snapshot.py` rewrites the golden files; do that only for a change meant to alter output,
and say so in its commit. tests/golden/test_golden.py compares.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import orjson
import yaml
from distillery_operator.render import (
    RenderContext,
    render_job,
    render_manifest_stream,
    render_trainer_identity,
)
from distillery_runtime.run.local import teacher_server_command
from distillery_runtime.run.local_gpus import NotEnoughGpus, TeacherGpus, plan_local_gpus

from distillery.api import Placement, TeacherEngine
from distillery.crd import build_crd
from distillery.plan import resolve
from distillery.plan.memory.features import resolve_memory_features
from distillery.runtime_config import resolve_runtime_config
from distillery.validation import load_jobs

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "out"
SOURCES = [*sorted((ROOT / "examples").glob("*.yaml")), Path(__file__).resolve().parent / "variants.yaml"]
VISIBLE_GPUS = [[], ["0"], ["0", "1"], [str(i) for i in range(8)]]


def _dump(objects: object) -> str:
    return yaml.safe_dump(objects, sort_keys=False, width=120)


SERVED_LOCALLY = "http://127.0.0.1:8000"


def _local_plan(path: Path) -> str:
    """The local launcher's decisions for each job of `path`, one YAML document per job."""
    docs = []
    for job in load_jobs(path):
        # A shared teacher runs locally as `--shared-teacher NAME=URL` names it: one local server here.
        served = {t.teacher_ref.name: SERVED_LOCALLY for t in job.spec.teachers if t.teacher_ref is not None}
        config = resolve_runtime_config(job, None, in_cluster=False, shared_teachers=served)
        engines = resolve(job.spec).engines
        placements: dict[str, object] = {}
        for visible in VISIBLE_GPUS:
            try:
                plan = plan_local_gpus(job.spec, visible)
            except NotEnoughGpus as refused:
                placements[str(len(visible))] = {"refused": refused.field, "message": str(refused)}
                continue
            commands = {}
            for resolved in config.teachers:
                engine = resolve(job.spec, local_gpus=len(visible)).engines[resolved.name].engine
                if resolved.placement != Placement.STANDALONE or engine == TeacherEngine.TRANSFORMERS:
                    continue  # a CPU teacher of a local run is a forward in the run's processes
                gpus: TeacherGpus | None = plan.teachers.get(resolved.name)
                command = teacher_server_command(engines[resolved.name], "MODEL_DIR", 8000, gpus)
                commands[resolved.name] = ["python", *command[1:]]
            placements[str(len(visible))] = {
                "student": plan.student,
                "teachers": {name: dataclasses.asdict(t) for name, t in plan.teachers.items()},
                "describe": plan.describe(),
                "teacher_commands": commands,
            }
        docs.append(
            {
                "job": job.metadata.name,
                "runtime_config": orjson.loads(config.model_dump_json(by_alias=True)),
                # The memory features the plan chose (student.training left auto) and why.
                "memory_features": resolve_memory_features(job.spec).lines(),
                "gpus": placements,
            }
        )
    return yaml.safe_dump_all(docs, sort_keys=False, width=120)


def _owned(path: Path) -> str:
    """The operator's objects with an owner and the teachers scaled to zero (a suspended job)."""
    objects = []
    for job in load_jobs(path):
        ctx = RenderContext(namespace="ml-team", owner_uid="0f1e2d3c-uid", teachers_scaled_to_zero=True)
        objects += [*render_trainer_identity(job, ctx), *render_job(job, ctx)]
    return _dump(objects)


def snapshot() -> dict[str, str]:
    """File name -> the text it must hold."""
    files = {"crd.yaml": _dump(build_crd())}
    for source in SOURCES:
        files[f"{source.stem}.render.yaml"] = render_manifest_stream(source)
        files[f"{source.stem}.owned.yaml"] = _owned(source)
        files[f"{source.stem}.local.yaml"] = _local_plan(source)
    return files


if __name__ == "__main__":
    GOLDEN.mkdir(exist_ok=True)
    for old in GOLDEN.glob("*.yaml"):
        old.unlink()
    for name, text in snapshot().items():
        (GOLDEN / name).write_text(text)
    print(f"wrote {len(snapshot())} golden files to {GOLDEN}", file=sys.stderr)
