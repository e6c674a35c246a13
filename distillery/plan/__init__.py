"""The resolved plan of a job: every setting derived from the spec, decided once, typed and immutable.

vLLM's `EngineArgs` is the shape: one object from which both a server's command-line flags and an in-process
engine's kwargs are derived. The pydantic and CEL rules of `distillery.api` validate a spec; this package is
where its numbers are derived. The operator's renderers, the local launcher, the colocated engine, teacher
scoring and the trainer read the plan and only translate it.
"""

from distillery.plan.grader import GraderKind, GraderPlan
from distillery.plan.job import JobPlan, resolve

__all__ = ["GraderKind", "GraderPlan", "JobPlan", "resolve"]
