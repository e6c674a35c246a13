"""Which teachers score a step's samples only once its rollout is done, instead of as each sample ends.

Scoring each sample as it leaves the rollout overlaps the teacher's prefill with the student's decoding: a
win wherever the teacher computes on devices of its own (its GPUs, its pods). Where it computes on the
rollout's own cores, the overlap is contention: on CPU, a local run's standalone teachers are servers on
this host, and a colocated teacher is an actor beside the rollout. There each early sample's request
interrupts the decode loop (the teacher's engine and the rollout's each want every core) and the
processes cannot take turns. Measured on the 2-core host (`distillery run` of the e2e bench's tiny job,
8 steps, medians, two runs each, `bench/README.md`): a step 1.308-1.355 s overlapped, 1.209-1.229 s
scored after the rollout (rollout 0.84 -> 0.68 s, teacher tail 0.23 -> 0.26 s); the addition job (answers
of ~5 tokens, which end within a step or two) the same either way (0.163-0.186 against 0.174-0.176 s).
"""

from __future__ import annotations

from distillery.api.spec import DistillationJobSpec, Placement


def teachers_scoring_after_rollout(spec: DistillationJobSpec, *, local: bool) -> frozenset[str]:
    """The teachers that share the rollout's CPU cores in this run (`local`: `distillery run`, whose
    standalone teachers are servers on this host): their samples wait for the rollout to end."""
    if spec.student.pool.gpus_per_worker > 0:  # the rollout decodes on a GPU; the host's cores are free
        return frozenset()
    on_this_host = {Placement.COLOCATED, Placement.STUDENT, *((Placement.STANDALONE,) if local else ())}
    return frozenset(t.name for t in spec.teachers if t.placement in on_this_host)
