"""Teacher backend for any vLLM OpenAI-compatible server (external teachers).

One `/v1/completions` request per sample: token ids as `prompt`, `max_tokens: 1`,
`prompt_logprobs: K`, so requests spread over replicas and retry independently. Answers are
aligned by `openai_parse`. Limits come from the caller or from `/v1/models`
(`max_model_len`); the server's `--max-logprobs` is not published, so a K above it is
recognised from the server's 400 answer and reported with the flag to raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from distillery_runtime.teachers.access import ClientAccess
from distillery_runtime.teachers.base import BatchTeacher, Rows
from distillery_runtime.teachers.clients.http import EndpointPool, HttpStatusError, HttpTransport
from distillery_runtime.teachers.clients.openai_parse import parse_completion
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.types import (
    ScoreRequest,
    SequenceTooLongError,
    TeacherError,
    TopKLimitError,
)

JSON = {"Content-Type": "application/json"}


class OpenAITeacher(BatchTeacher):
    """Scores through the OpenAI JSON API of one or more replicas."""

    def __init__(
        self,
        endpoints: Sequence[str],
        model: str,
        *,
        name: str | None = None,
        max_logprobs: int | None = None,
        max_model_len: int | None = None,
        concurrency: int = 8,
        retry: RetryPolicy | None = None,
        resolve_dns: bool = False,
        access: ClientAccess | None = None,
    ) -> None:
        self.name = name or model
        self.model = model
        self._max_logprobs = max_logprobs
        self._max_model_len = max_model_len
        self.transport = HttpTransport(
            EndpointPool(endpoints, concurrency=concurrency, resolve_dns=resolve_dns),
            retry,
            name=self.name,
            access=access,
        )
        self._limits_lock: asyncio.Lock | None = None

    async def _limits(self) -> tuple[int | None, int | None]:
        if self._max_model_len is None:
            self._limits_lock = self._limits_lock or asyncio.Lock()
            async with self._limits_lock:
                if self._max_model_len is None:
                    doc = orjson.loads(await self.transport.request("GET", "/v1/models"))
                    for m in doc.get("data", []):
                        if m.get("id") == self.model:
                            self._max_model_len = int(m.get("max_model_len") or 0) or None
                    if self._max_model_len is None:
                        served = [m.get("id") for m in doc.get("data", [])]
                        raise TeacherError(
                            f"teacher {self.name}: model {self.model!r} is not served (serves {served})"
                        )
        return self._max_model_len, self._max_logprobs

    async def _score_rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        return list(await asyncio.gather(*(self._one(s, i, top_k) for i, s in enumerate(samples))))

    async def _one(self, sample: ScoreRequest, index: int, top_k: int) -> Rows:
        tokens = [*sample.prompt_ids, *sample.response_ids]
        body = orjson.dumps(
            {
                "model": self.model,
                "prompt": tokens,
                "max_tokens": 1,
                "prompt_logprobs": top_k,
                "temperature": 1.0,
            }
        )
        try:
            answer = await self.transport.request("POST", "/v1/completions", body, JSON)
        except HttpStatusError as exc:
            raise self._explain(exc, sample, index, top_k) from exc
        return parse_completion(answer, len(sample.prompt_ids), sample.response_ids, top_k)

    def _explain(self, exc: HttpStatusError, sample: ScoreRequest, index: int, top_k: int) -> TeacherError:
        text = exc.body.decode("utf-8", "replace")
        try:
            message = orjson.loads(exc.body)["error"]["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = text
        name = sample.sample_id or f"#{index}"
        if "logprobs" in message and ("max allowed" in message or "greater than" in message):
            return TopKLimitError(
                f"teacher {self.name}: top_k={top_k} refused by {exc.url}: {message}; start the teacher "
                f"with `--max-logprobs {top_k}` (or more), or lower top_k"
            )
        # a prompt of exactly max_model_len tokens leaves no room for the one generated token
        if (
            "context length" in message
            or "maximum model length" in message
            or "max_tokens must be at least" in message
        ):
            n = len(sample.prompt_ids) + len(sample.response_ids)
            return SequenceTooLongError(f"teacher {self.name}: sample {name} ({n} tokens) refused: {message}")
        return TeacherError(f"teacher {self.name}: sample {name} refused (HTTP {exc.status}): {message}")

    async def close(self) -> None:
        await self.transport.close()
