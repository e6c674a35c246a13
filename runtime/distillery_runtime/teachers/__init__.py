"""Teacher scoring: top-k log-probs from vLLM teachers, aligned with the student's tokens.

Backends (all implement `Teacher`): `OpenAITeacher` (any vLLM OpenAI server; external
teachers), `CompactTeacher` (Distillery's teacher server, binary endpoint; standalone
teachers), `ColocatedTeacher` (in-process vLLM engine; imported lazily, it needs vLLM).
`MultiTeacherScorer` routes samples by their `route` value. The teacher server is
`python -m distillery_runtime.teachers.server`.
"""

from distillery_runtime.teachers.base import BatchTeacher
from distillery_runtime.teachers.compact_http import CompactTeacher
from distillery_runtime.teachers.openai_http import OpenAITeacher
from distillery_runtime.teachers.retry import RetryPolicy
from distillery_runtime.teachers.router import MultiTeacherScorer
from distillery_runtime.teachers.tokenizer_compat import (
    check_tokenizer_compat,
    check_vocabulary,
    first_difference,
    tokenizer_vocabulary,
)
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
        from distillery_runtime.teachers.colocated import ColocatedTeacher

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
