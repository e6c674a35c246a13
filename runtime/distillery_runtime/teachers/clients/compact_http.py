"""Teacher backend for Distillery's teacher server: the compact binary endpoint.

Samples go in chunks of `batch_size` sequences per request (the engine batches within a
request; chunks spread over replicas and retry independently). The answer is packed
little-endian arrays (`wire`), decoded zero-copy and scattered into the dense layout
without a per-entry or per-position Python loop. Every request carries the job's identity
(`X-Distillery-Job`), by which a shared teacher shares its engine among jobs and accounts for each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import orjson

from distillery_runtime.teachers.access import ClientAccess
from distillery_runtime.teachers.base import BatchTeacher
from distillery_runtime.teachers.clients.coalesce import Coalescer
from distillery_runtime.teachers.clients.http import EndpointPool, HttpStatusError, HttpTransport
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.dense import check_top_k, empty_scores, pack_flat
from distillery_runtime.teachers.types import (
    InvalidSampleError,
    ScoreRequest,
    SequenceTooLongError,
    TeacherError,
    TeacherScores,
    TopKLimitError,
)
from distillery_runtime.teachers.wire import (
    INFO_PATH,
    JOB_HEADER,
    SCORE_PATH,
    WireSequence,
    decode_response,
    encode_request,
)

_ERRORS: dict[str, type[TeacherError]] = {
    "TopKLimitError": TopKLimitError,
    "SequenceTooLongError": SequenceTooLongError,
    "InvalidSampleError": InvalidSampleError,
}


class CompactTeacher(BatchTeacher):
    """Scores through `POST /distillery/v1/score` of one or more teacher-server replicas."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        name: str = "teacher",
        max_logprobs: int | None = None,
        max_model_len: int | None = None,
        concurrency: int = 4,
        batch_size: int = 8,
        retry: RetryPolicy | None = None,
        resolve_dns: bool = False,
        access: ClientAccess | None = None,
        coalesce: tuple[int, int] | None = None,
        job: str | None = None,
    ) -> None:
        """`coalesce`: (requests in flight, tokens a request) for samples scored one by one (`score_one`),
        which then share requests (teachers/clients/coalesce.py); None: a request each. `job`: the identity sent
        with every request (`wire.job_identity`); None: none (the server counts it as `unknown`)."""
        self.name = name
        self.headers = {JOB_HEADER: job} if job else {}
        self.batch_size = max(1, batch_size)
        self._max_logprobs = max_logprobs
        self._max_model_len = max_model_len
        self.transport = HttpTransport(
            EndpointPool(endpoints, concurrency=concurrency, resolve_dns=resolve_dns),
            retry,
            name=name,
            access=access,
        )
        self._info_lock: asyncio.Lock | None = None
        self.coalescer = (
            Coalescer(self._score_each, in_flight=coalesce[0], max_tokens=coalesce[1]) if coalesce else None
        )

    async def _limits(self) -> tuple[int | None, int | None]:
        if self._max_model_len is None or self._max_logprobs is None:
            self._info_lock = self._info_lock or asyncio.Lock()
            async with self._info_lock:
                if self._max_model_len is None or self._max_logprobs is None:
                    info = orjson.loads(await self.transport.request("GET", INFO_PATH, headers=self.headers))
                    self._max_model_len = self._max_model_len or int(info["max_model_len"])
                    self._max_logprobs = (
                        self._max_logprobs if self._max_logprobs is not None else int(info["max_logprobs"])
                    )
        return self._max_model_len, self._max_logprobs

    async def score(self, samples: Sequence[ScoreRequest], top_k: int) -> TeacherScores:
        if not samples:
            check_top_k(top_k, None, self.name)
            return empty_scores(top_k)
        await self.validate(samples, top_k)
        wire = [
            WireSequence([*s.prompt_ids, *s.response_ids], len(s.prompt_ids), s.sample_id or str(i))
            for i, s in enumerate(samples)
        ]
        chunks = [wire[i : i + self.batch_size] for i in range(0, len(wire), self.batch_size)]
        answers = await asyncio.gather(*(self._post(c, top_k) for c in chunks))
        lengths = np.concatenate([a[0] for a in answers])
        return pack_flat(
            lengths,
            np.concatenate([a[1] for a in answers]),
            np.concatenate([a[2] for a in answers]),
            np.concatenate([a[3] for a in answers]),
            top_k,
            [s.sample_id for s in samples],
        )

    async def score_one(self, sample: ScoreRequest, top_k: int) -> TeacherScores:
        """Score one sample as soon as its rollout finishes; with `coalesce`, in a request shared with the
        samples that arrive while the others are out."""
        if self.coalescer is None:
            return await self.score([sample], top_k)
        await self.validate([sample], top_k)  # its own clear error, before it joins a request
        return await self.coalescer.score_one(sample, top_k)

    async def _score_each(self, samples: Sequence[ScoreRequest], top_k: int) -> list[TeacherScores]:
        """One request for `samples`; each sample's scores (B = 1), in order."""
        wire = [
            WireSequence([*s.prompt_ids, *s.response_ids], len(s.prompt_ids), s.sample_id or str(i))
            for i, s in enumerate(samples)
        ]
        lengths, ids, lps, tok = await self._post(wire, top_k)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        return [
            pack_flat(lengths[i : i + 1], ids[a:b], lps[a:b], tok[a:b], top_k, [s.sample_id])
            for i, (s, a, b) in enumerate(zip(samples, starts, ends, strict=True))
        ]

    async def _post(self, chunk: list[WireSequence], top_k: int):  # type: ignore[no-untyped-def]
        try:
            body = await self.transport.request(
                "POST", SCORE_PATH, encode_request(chunk, top_k), headers=self.headers
            )
        except HttpStatusError as exc:
            try:
                err = orjson.loads(exc.body)["error"]
                cls, message = _ERRORS.get(err.get("type", ""), TeacherError), err["message"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                cls, message = TeacherError, str(exc)
            raise cls(f"teacher {self.name} ({exc.url}): {message}") from exc
        lengths, ids, lps, tok, k = decode_response(body)
        expected = [len(s.token_ids) - s.prompt_len for s in chunk]
        if k != top_k or lengths.tolist() != expected:
            raise TeacherError(
                f"teacher {self.name}: answer shape K={k}, lengths {lengths.tolist()} != asked {expected}"
            )
        return lengths, ids, lps, tok

    async def close(self) -> None:
        if self.coalescer is not None:
            await self.coalescer.close()
        await self.transport.close()
