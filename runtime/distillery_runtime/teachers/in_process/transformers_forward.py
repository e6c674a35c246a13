"""A teacher scored by the model's own transformers forward in this process: the engine
`plan.scoring_engine` picks where the teacher computes on the student's CPU cores (why: its docstring).

Samples are scored in groups of similar length, right-padded into one batch: a causal model's position
never attends to a later one, so the padding after a sample changes none of its log-probs and needs no
attention mask. Only the positions that predict a response token get logits (`logits_to_keep`), and a group
is bounded so that they fit `LOGITS_BYTES` at the model's vocabulary; the plan says where a cut into one more
forward is worth its padding (`plan.padding`). Log-probs are of the model's raw
logits in float32, as vLLM's prompt log-probs are, and the top-k is exact (`fast_topk.cpu_topk` on CPU
past its crossover).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from distillery.plan.teachers.engines import EngineSettings
from distillery_runtime.data.packing import length_groups
from distillery_runtime.teachers.base import BatchTeacher, Rows
from distillery_runtime.teachers.serving.fast_topk import MIN_K, cpu_topk
from distillery_runtime.teachers.types import ScoreRequest

BATCH_TOKENS = 16384
"""Most tokens (rows x the longest row) in one forward: its activations, not its logits, are bounded here."""
LOGITS_BYTES = 256 << 20
"""Most bytes of float32 logits one forward makes (kept positions x rows x vocabulary), twice that with the
log-softmax: 130 positions of 32 samples at a 151k vocabulary take four forwards."""


def _length(sample: ScoreRequest) -> int:
    return len(sample.prompt_ids) + len(sample.response_ids)


def forward_groups(
    samples: Sequence[ScoreRequest], vocabulary: int, forward_cost: int | None = None
) -> list[list[int]]:
    """The samples' indices in groups to score together, by length (`packing.length_groups`: cut where a cut
    saves more than `forward_cost` padded tokens, None: the fewest groups), each group within `BATCH_TOKENS`
    of padded tokens and `LOGITS_BYTES` of logits (one sample a group at least)."""

    def fits(rows: int, width: int, first: int) -> bool:
        # `first`: the group's first kept position, its shortest prompt's last token.
        return rows * width <= BATCH_TOKENS and rows * (width - 1 - first) * vocabulary * 4 <= LOGITS_BYTES

    starts = [len(s.prompt_ids) - 1 for s in samples]
    return length_groups([_length(s) for s in samples], forward_cost, fits, starts)


class TransformersTeacher(BatchTeacher):
    """One teacher model's forward, on `device` in `dtype`."""

    def __init__(
        self, model_dir: str, engine: EngineSettings, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self._take(
            model.to(device).eval(),  # type: ignore[arg-type]  # transformers' decorated `to`
            AutoTokenizer.from_pretrained(model_dir),
            engine,
        )

    @classmethod
    def of_model(
        cls,
        model: Any,
        tokenizer: Any,
        engine: EngineSettings,
        forward_context: Callable[[], AbstractContextManager[Any]],
    ) -> TransformersTeacher:
        """A teacher on a model another part of this process holds (the student's, `student_base`), each
        forward inside `forward_context()` (the adapter off), on the model's own device."""
        teacher = cls.__new__(cls)
        teacher._take(model, tokenizer, engine, forward_context)
        return teacher

    def _take(
        self,
        model: Any,
        tokenizer: Any,
        engine: EngineSettings,
        forward_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        self.name = engine.served_model_name
        self.engine_settings = engine
        self.model = model
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.forward_context = forward_context
        self.vocabulary_size = int(model.get_output_embeddings().weight.shape[0])
        forward = getattr(model, "get_base_model", lambda: model)().forward  # a peft model's is generic
        self.keeps_logits = "logits_to_keep" in inspect.signature(forward).parameters

    async def start(self) -> TransformersTeacher:
        """Nothing to start: the model loaded with the object (the same call as a vLLM teacher's)."""
        return self

    async def _limits(self) -> tuple[int | None, int | None]:
        return self.engine_settings.max_model_len, self.engine_settings.max_logprobs

    async def _score_rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        return self.rows(samples, top_k)

    def rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        """Each sample's (top-k ids [T, K], top-k log-probs [T, K], the response token's log-prob [T])."""
        out: dict[int, Rows] = {}
        cost = self.engine_settings.forward_cost_tokens
        for group in forward_groups(samples, self.vocabulary_size, cost):
            out.update(zip(group, self._group_rows([samples[i] for i in group], top_k), strict=True))
        return [out[index] for index in range(len(samples))]

    @torch.no_grad()
    def _group_rows(self, samples: Sequence[ScoreRequest], top_k: int) -> list[Rows]:
        lengths = [len(s.response_ids) for s in samples]
        if not any(lengths):
            return [_empty_rows(top_k) for _ in samples]
        width = max(_length(s) for s in samples)
        ids = torch.zeros((len(samples), width), dtype=torch.long)
        for row, s in enumerate(samples):
            ids[row, : _length(s)] = torch.tensor([*s.prompt_ids, *s.response_ids])
        # Position j predicts token j + 1: the kept positions run from the first response token's predictor
        # to the last one's, over the group.
        first = min(len(s.prompt_ids) for s in samples) - 1
        keep = torch.arange(first, width - 1)
        extra = {"logits_to_keep": keep.to(self.device)} if self.keeps_logits else {}
        with self.forward_context():
            logits = self.model(input_ids=ids.to(self.device), use_cache=False, **extra).logits
        if not self.keeps_logits:
            logits = logits[:, keep.to(self.device)]
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        # Each sample's own positions, in C order: the concatenation of the samples' rows.
        starts = torch.tensor([len(s.prompt_ids) - 1 - first for s in samples])
        at = torch.arange(len(keep))[None, :]
        mine = (at >= starts[:, None]) & (at < starts[:, None] + torch.tensor(lengths)[:, None])
        flat = logp[mine]
        targets = torch.tensor([t for s in samples for t in s.response_ids], dtype=torch.long)
        token = flat.gather(-1, targets[:, None])[:, 0].numpy()
        if top_k == 0:
            values, indices = np.zeros((len(flat), 0), np.float32), np.zeros((len(flat), 0), np.int32)
        elif top_k >= MIN_K and top_k < flat.shape[-1]:
            top_values, top_indices = cpu_topk(flat, top_k)
            values, indices = top_values.numpy(), top_indices.numpy()
        else:
            top = flat.topk(top_k, dim=-1)
            values, indices = top.values.numpy(), top.indices.numpy()
        bounds = np.cumsum([0, *lengths])
        return [
            (
                indices[a:b].astype(np.int32),
                values[a:b].astype(np.float32),
                token[a:b].astype(np.float32),
            )
            for a, b in itertools.pairwise(bounds)
        ]

    def vocabulary(self) -> dict[int, str]:
        """The id -> token map of the teacher's tokenizer (`tokenizer_compat`)."""
        from distillery_runtime.teachers.checks.tokenizer_compat import tokenizer_vocabulary

        return tokenizer_vocabulary(self.tokenizer)

    async def sleep(self) -> None:
        """Nothing to free: the forward holds no cache between steps, and its weights stay."""

    async def wake_up(self) -> None:
        """Nothing to restore."""


def _empty_rows(top_k: int) -> Rows:
    return np.zeros((0, top_k), np.int32), np.zeros((0, top_k), np.float32), np.zeros((0,), np.float32)
