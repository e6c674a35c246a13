"""vLLM's GPU memory fraction of each teacher: the defaults of each placement, and the colocated budget.

A colocated teacher is awake together with the student's rollout engine (samples are scored as they come
out), and vLLM refuses to start when the fraction it asks for exceeds the free memory, so the job's
fractions must add up on the student's GPUs; the CLI and the CRD both check it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from support.openapi import validate as crd_validate

from distillery.plan import resolve
from distillery.validation import InvalidManifest, parse_job


def colocated_job(base: dict[str, Any], rollout: float | None, *fractions: float | None) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    spec = doc["spec"]
    if rollout is not None:
        spec["student"]["rollout"] = {"memoryFraction": rollout}
    spec["teachers"] = [{"name": "math", "model": "m", "routes": ["math"]}]
    for i, fraction in enumerate(fractions):
        teacher: dict[str, Any] = {
            "name": f"co{i}",
            "model": "m",
            "placement": "colocated",
            "routes": [f"r{i}"],
        }
        if fraction is not None:
            teacher["inference"] = {"memoryFraction": fraction}
        spec["teachers"].append(teacher)
    spec["teachers"][-1]["default"] = True
    return doc


@pytest.mark.parametrize(
    ("rollout", "fractions", "expected"),
    [
        # rollout default 0.5 leaves 0.4 below the 0.9 ceiling, split among the teachers that set none.
        (None, (None,), [0.4]),
        (None, (None, None), [0.2, 0.2]),
        (0.3, (0.4,), [0.4]),
        (0.3, (0.2, None), [0.2, 0.4]),
        (0.5, (0.45,), [0.45]),  # every fraction set: up to 0.95 in all
    ],
)
def test_colocated_fractions_default_to_what_the_rollout_engine_leaves(
    base_manifest: dict[str, Any],
    crd_schema: dict[str, Any],
    rollout: float | None,
    fractions: tuple[float | None, ...],
    expected: list[float],
) -> None:
    doc = colocated_job(base_manifest, rollout, *fractions)
    job = parse_job(doc)
    colocated = [t for t in job.spec.teachers if t.placement.value == "colocated"]
    fractions = resolve(job.spec).gpu_budget.teacher_fractions
    assert [fractions[t.name] for t in colocated] == expected
    assert fractions[job.spec.teachers[0].name] == 0.9  # standalone: vLLM's default
    # The API server, which applies the CRD's defaults first, accepts what the CLI accepts.
    assert crd_validate({"metadata": doc["metadata"], "spec": doc["spec"]}, crd_schema) == []


@pytest.mark.parametrize(
    ("rollout", "fractions"),
    [(0.5, (0.5,)), (0.6, (0.2, 0.2)), (0.88, (None,)), (0.5, (0.4, None))],
)
def test_colocated_fractions_that_do_not_fit_are_refused_by_the_cli_and_the_crd(
    base_manifest: dict[str, Any],
    crd_schema: dict[str, Any],
    rollout: float,
    fractions: tuple[float | None, ...],
) -> None:
    doc = colocated_job(base_manifest, rollout, *fractions)
    with pytest.raises(InvalidManifest) as error:
        parse_job(doc)
    assert [p.path for p in error.value.problems] == ["spec.teachers"]
    assert "memoryFraction" in error.value.problems[0].reason
    crd_errors = crd_validate({"metadata": doc["metadata"], "spec": doc["spec"]}, crd_schema)
    assert [e.path for e in crd_errors] == ["spec.teachers"], crd_errors
