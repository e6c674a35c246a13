"""Teacher scoring: top-k log-probs from vLLM teachers, aligned with the student's tokens.

Backends (all implement `Teacher`): `OpenAITeacher` (any vLLM OpenAI server; external
teachers), `CompactTeacher` (Distillery's teacher server, binary endpoint; standalone
teachers), `ColocatedTeacher` (in-process vLLM engine; imported lazily, it needs vLLM).
`MultiTeacherScorer` routes samples by their `route` value. The teacher server is
`python -m distillery_runtime.teachers.server`.

Loose here: the contract (`types`, `wire`, `dense`, `base`), client settings (`access`), routing and the
loop's scoring wiring (`scoring`). Its rooms: `clients/` (the HTTP backends), `checks/` (before step 1),
`serving/` (the teacher server's parts) and `in_process/` (teachers computed in the run's processes).
"""

from distillery_runtime.teachers.base import BatchTeacher
from distillery_runtime.teachers.checks.tokenizer_compat import (
    check_tokenizer_compat,
    check_vocabulary,
    first_difference,
    tokenizer_vocabulary,
)
from distillery_runtime.teachers.clients.compact_http import CompactTeacher
from distillery_runtime.teachers.clients.openai_http import OpenAITeacher
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.router import MultiTeacherScorer
from distillery_runtime.teachers.types import (
    InvalidSampleError,
    ScoreRequest,
    SequenceTooLongError,
    Teacher,
    TeacherError,
    TeacherScores,
    TeacherUnavailableError,
    TokenizerMismatchError,
    TopKLimitError,
    UnknownRouteError,
)


def __getattr__(name: str):  # lazy: only colocated teachers need vLLM in this process
    if name == "ColocatedTeacher":
        from distillery_runtime.teachers.in_process.colocated import ColocatedTeacher

        return ColocatedTeacher
    raise AttributeError(name)


__all__ = [
    "BatchTeacher",
    "ColocatedTeacher",
    "CompactTeacher",
    "InvalidSampleError",
    "MultiTeacherScorer",
    "OpenAITeacher",
    "RetryPolicy",
    "ScoreRequest",
    "SequenceTooLongError",
    "Teacher",
    "TeacherError",
    "TeacherScores",
    "TeacherUnavailableError",
    "TokenizerMismatchError",
    "TopKLimitError",
    "UnknownRouteError",
    "check_tokenizer_compat",
    "check_vocabulary",
    "first_difference",
    "tokenizer_vocabulary",
]
