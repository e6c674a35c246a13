"""Before step 1: every replica of a served teacher scores one probe, and replicas that disagree stop the run.

Scoring spreads a teacher's samples over its replicas (`teachers.http`), so replicas that score the same
tokens differently (another checkpoint, dtype or engine setting behind one Service: SkyRL issue 2256)
make the student learn which replica each sample reached. The probe is a few tokens of the student's
tokenizer (`distillery.plan.teachers.consistency.PROBE_TEXT`), the same ids for every replica, each
replica sent it directly (not through the pool's choice of endpoint): a plain-http endpoint's host name
(a standalone or shared teacher's headless Service) is resolved to every address behind it, as the
scoring client does; an https one is taken as given (its certificate names the host, and replicas behind
a hosted API's load balancer cannot be reached one by one). The comparison and its tolerance are the
plan's; a teacher with one replica sends nothing. Teachers computed in the run have one engine each; a
colocated one compares its own answer after every wake with its first (`teachers.colocated`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from distillery.plan import JobPlan
from distillery.plan.teachers.consistency import (
    PROBE_TEXT,
    PROBE_TOKENS,
    PROBE_TOP_K,
    TEACHER_CONSISTENCY_TOLERANCE,
    ConsistencyTolerance,
    ProbeAnswer,
    ReplicaDisagreement,
    disagreeing_replicas,
    probe_difference,
)
from distillery.plan.teachers.engines import EngineSettings
from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, TeacherProtocol
from distillery_runtime.teachers.clients.http import EndpointPool
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.types import ScoreRequest, TeacherError, TeacherScores

PROBE_RETRY = RetryPolicy(total_timeout=30.0, request_timeout=30.0)
"""A replica scores the probe within this, or is left out of the comparison (said, not fatal: scoring
routes around a replica that does not answer, and a teacher down for good is the outage budget's)."""


class TeacherInconsistentError(TeacherError):
    """Replicas of one teacher score the start-up probe differently; the run refuses to start."""


def probe_request(student_tokenizer: Any) -> ScoreRequest:
    """The probe in the student's ids: the tokenizer's BOS (else the text's first token) as the prompt, the
    text's tokens (at most PROBE_TOKENS) as the response scored."""
    ids = list(student_tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
    bos = getattr(student_tokenizer, "bos_token_id", None)
    if bos is not None:
        return ScoreRequest([bos], ids[:PROBE_TOKENS], "consistency-probe")
    return ScoreRequest(ids[:1], ids[1 : PROBE_TOKENS + 1], "consistency-probe")


def probe_answer(scores: TeacherScores) -> ProbeAnswer:
    """The first sample's scores as the plan compares them: finite top-k entries only (padding is -inf)."""
    length = int(scores.mask[0].sum())
    topk = tuple(
        {int(i): float(v) for i, v in zip(ids, values, strict=True) if np.isfinite(v)}
        for ids, values in zip(scores.topk_ids[0, :length], scores.topk_logprobs[0, :length], strict=True)
    )
    return ProbeAnswer(tuple(float(v) for v in scores.token_logprobs[0, :length]), topk)


async def replica_urls(teacher: ResolvedTeacher) -> list[tuple[str, str]]:
    """(replica URL, the endpoint it is behind) of each replica, as the scoring client spreads requests over
    them: a plain-http endpoint's host name resolved to every address behind it (a headless Service's
    pods); an https one as given (its certificate names the host, so the client connects by name)."""
    out: list[tuple[str, str]] = []
    for url in teacher.endpoints:
        if urlsplit(url).scheme != "http":
            out.append((url.rstrip("/"), url.rstrip("/")))
            continue
        pool = EndpointPool([url], resolve_dns=True)
        try:
            await pool.refresh()
        except OSError:  # the name answered the readiness wait; if it does not resolve now, probe it as it is
            out.append((url.rstrip("/"), url.rstrip("/")))
            continue
        out.extend((endpoint.url, url.rstrip("/")) for endpoint in pool.endpoints)
    return list(dict.fromkeys(out))


def replica_label(url: str, behind: str) -> str:
    """A replica as the error names it: its address, and the Service name it was found behind."""
    return url if url == behind else f"{url} (behind {behind})"


def disagreement_message(
    teacher: str,
    labels: Sequence[str],
    disagreements: Sequence[ReplicaDisagreement],
    tolerance: ConsistencyTolerance = TEACHER_CONSISTENCY_TOLERANCE,
) -> str:
    """One line naming the teacher, each replica out of line, the replica it was compared with, and by how
    much."""
    parts = [
        f"replica {labels[d.replica]} differs from replica {labels[d.reference]} by "
        f"{d.difference.mean_abs_nats:.3f} nats on average and {d.difference.max_abs_nats:.3f} at probe "
        f"token {d.difference.position}"
        for d in disagreements
    ]
    return (
        f"{teacher}: its replicas score the start-up probe differently: {'; '.join(parts)} (tolerance "
        f"{tolerance.mean_abs_nats} on average, {tolerance.max_abs_nats} at any token); every replica must "
        "serve the same weights with the same dtype and engine settings, or the student learns which replica "
        "scored each sample"
    )


def check_after_wake(teacher: str, first: Sequence[float], now: Sequence[float]) -> None:
    """A colocated teacher's probe log-probs after a wake against its first answer (at start): beyond the
    plan's tolerance, TeacherInconsistentError (its weights did not come back: a known failure of a woken
    engine is -ln V at every token)."""
    difference = probe_difference(ProbeAnswer(tuple(first)), ProbeAnswer(tuple(now)))
    tolerance = TEACHER_CONSISTENCY_TOLERANCE
    if difference.beyond(tolerance):
        raise TeacherInconsistentError(
            f"teacher {teacher}: after wake-up its probe log-probs moved by {difference.mean_abs_nats:.3f} nats "
            f"on average and {difference.max_abs_nats:.3f} at token {difference.position} (tolerance "
            f"{tolerance.mean_abs_nats} on average, {tolerance.max_abs_nats} at any token): the weights were not "
            "restored"
        )


async def check_replicas(
    teacher: ResolvedTeacher,
    engine: EngineSettings,
    probe: ScoreRequest,
    *,
    label: str,
    say: Callable[[str], None],
    job: str | None = None,
    retry: RetryPolicy = PROBE_RETRY,
) -> None:
    """Score `probe` on each replica of `teacher` and raise TeacherInconsistentError (one line, `label`
    naming the teacher) where one is beyond the plan's tolerance. Replicas that do not answer are said and
    left out."""
    from distillery_runtime.teachers.scoring import build_client

    replicas = await replica_urls(teacher)
    if len(replicas) < 2:
        return
    top_k = min(PROBE_TOP_K, teacher.max_logprobs)

    async def score(url: str) -> TeacherScores:
        client = build_client(teacher.model_copy(update={"endpoints": [url]}), engine, None, retry, job)
        try:
            return await client.score([probe], top_k)
        finally:
            await client.close()

    results = await asyncio.gather(*(score(url) for url, _ in replicas), return_exceptions=True)
    labels: list[str] = []
    answers: list[ProbeAnswer] = []
    for (url, behind), result in zip(replicas, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result  # cancelled: the run is stopping
            say(
                f"teacher {teacher.name}: replica {replica_label(url, behind)} could not score the start-up "
                f"probe, so it is not compared ({result})"
            )
            continue
        labels.append(replica_label(url, behind))
        answers.append(probe_answer(result))
    disagreements = disagreeing_replicas(answers)
    if disagreements:
        raise TeacherInconsistentError(disagreement_message(label, labels, disagreements))
    if len(answers) > 1:
        say(f"teacher {teacher.name}: its {len(answers)} replicas agree on the start-up probe")


async def check_teacher_replicas(
    config: RuntimeConfig, plan: JobPlan, student_tokenizer: Any, say: Callable[[str], None]
) -> None:
    """Before step 1, once the served teachers answer: each served teacher's replicas agree on the probe, or
    TeacherInconsistentError names the teacher (`spec.teachers[i] (name)`) and the replica."""
    from distillery_runtime.teachers.wire import job_identity

    probe = probe_request(student_tokenizer)
    job = job_identity(config.job_name, config.namespace)
    resolved = {t.name: t for t in config.teachers}
    for index, teacher in enumerate(config.spec.teachers):
        served = resolved[teacher.name]
        if served.protocol == TeacherProtocol.IN_PROCESS:
            continue
        await check_replicas(
            served,
            plan.engines[teacher.name],
            probe,
            label=f"spec.teachers[{index}] ({teacher.name})",
            say=say,
            job=job,
        )
