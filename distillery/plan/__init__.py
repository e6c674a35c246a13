"""The resolved plan of a job: every setting derived from the spec, decided once, typed and immutable.

vLLM's `EngineArgs` is the shape: one object from which both a server's command-line flags and an in-process
engine's kwargs are derived. The pydantic and CEL rules of `distillery.api` validate a spec; this package is
where its numbers are derived. The operator's renderers, the local launcher, the colocated engine, teacher
scoring and the trainer read the plan and only translate it.

The decisions are grouped by what they decide, under the names of the runtime's rooms that carry them out
where there is one (`teachers/` across from `distillery_runtime.teachers`, `rollout/`, `checkpoints/`,
`data/`, `agents/`) and by their own where the runtime has none (`memory/`, `placement/`, `pods/`, `env/`,
`access/`). At the top: `job` (`resolve`, the one entry point of a job) and `shared_teacher` (a
DistillationTeacher's), and the decisions every room reads: the loss, the LoRA adapter, the attention
kernels, the trainer's settings and the grader. `tests/test_layering.py` keeps the rooms' arrows one way
(`PLAN_ROOMS`).
"""

from distillery.plan.grader import GraderKind, GraderPlan
from distillery.plan.job import JobPlan, resolve

__all__ = ["GraderKind", "GraderPlan", "JobPlan", "resolve"]
