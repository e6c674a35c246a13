"""A job's demands against what its served teachers report, checked once they answer, before the first step.

A shared teacher (a DistillationTeacher, or `distillery serve-teacher` locally) was started with its own
maxLogprobs and context, not the job's: a job asking for a larger loss.topK or longer sequences would
otherwise fail at its first scoring request, deep in a step. Our teacher server reports its limits at
`/distillery/v1/info`; `served_limit_problems` compares (pure), `check_served_limits` asks (I/O).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distillery.api.spec import Placement
from distillery.plan.agents.episodes import response_tokens
from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, TeacherProtocol
from distillery_runtime.teachers.types import TeacherError
from distillery_runtime.teachers.wire import INFO_PATH


class ServedLimitsError(TeacherError):
    """A served teacher cannot score what the job asks for (one line per problem, each naming its field)."""


def _served_by(index: int, teacher: ResolvedTeacher, spec_teacher: Any) -> str:
    ref = spec_teacher.teacher_ref
    if teacher.placement == Placement.SHARED and ref is not None:
        return f"DistillationTeacher {ref.name} (spec.teachers[{index}], at {teacher.endpoints[0]})"
    return f"teacher {teacher.name}'s server (at {teacher.endpoints[0]})"


def served_limit_problems(config: RuntimeConfig, infos: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per limit a teacher's server reports (`infos`: its /distillery/v1/info, keyed by the
    teacher's name) below what the job needs: its log-probs per position (loss.topK), its context (the
    longest prompt and response) and the model name the job sends."""
    problems: list[str] = []
    for index, (resolved, spec_teacher) in enumerate(zip(config.teachers, config.spec.teachers, strict=True)):
        info = infos.get(resolved.name)
        if info is None:
            continue
        served = _served_by(index, resolved, spec_teacher)
        if int(info["max_logprobs"]) < resolved.max_logprobs:
            problems.append(
                f"spec.loss.topK: {config.spec.loss.top_k} is more than {served} returns per position "
                f"(maxLogprobs {info['max_logprobs']}); lower topK or raise its maxLogprobs"
            )
        if int(info["max_model_len"]) < resolved.max_model_len:
            problems.append(
                f"spec.data.maxPromptTokens: prompts of {config.spec.data.max_prompt_tokens} tokens and responses "
                f"of {response_tokens(config.spec)} need a context of {resolved.max_model_len}; "
                f"{served} serves {info['max_model_len']} (raise its inference.maxModelLen)"
            )
        names = info.get("model") or []
        names = [names] if isinstance(names, str) else list(names)
        if names and resolved.served_model_name not in names:
            problems.append(
                f"spec.teachers[{index}]: {served} serves {', '.join(map(str, names))}, "
                f"not {resolved.served_model_name}"
            )
    return problems


async def check_served_limits(config: RuntimeConfig, timeout: float = 30.0) -> None:
    """Ask every teacher that runs our server (compact protocol) for its limits; ServedLimitsError with
    every problem. Call once the teachers answer their health check; one that does not answer this is
    skipped. Asked as the scoring client asks (its TLS context and key, `teachers.access`): a teacher that
    wants a key refuses a request without one."""
    import aiohttp
    import orjson

    from distillery_runtime.teachers.access import client_access

    infos: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for teacher in config.teachers:
            if teacher.protocol != TeacherProtocol.COMPACT or not teacher.endpoints:
                continue
            access = client_access(teacher.name, teacher.client, teacher.endpoints)
            url = teacher.endpoints[0].rstrip("/") + INFO_PATH
            try:
                async with session.get(url, ssl=access.ssl, headers=access.headers) as response:
                    response.raise_for_status()
                    infos[teacher.name] = orjson.loads(await response.read())
            except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError):
                # Not checked here, not refused: the scoring client reads the same limits on its first
                # request and fails there with the teacher's name (`teachers.compact_http`).
                continue
    problems = served_limit_problems(config, infos)
    if problems:
        raise ServedLimitsError("\n".join(problems))
