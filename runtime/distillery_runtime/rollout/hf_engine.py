"""The transformers rollout engine: `model.generate`, the slow fallback (no vLLM on the machine).

Each request is sampled on its own with a torch generator seeded from the request, so that a sample
does not depend on which other prompts share its step (the same reproducibility vLLM's per-request
seed gives). Weights are loaded with `load_state_dict`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence

import torch

from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.samples import RolloutSample
from distillery_runtime.weight_sync import SyncGroup, TensorMeta


class TransformersRolloutEngine:
    """Student sampling with transformers generate."""

    def __init__(self, model_dir: str, *, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers' decorated `to`
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos
        self.policy_version = 0
        self.sync_ranks = 1
        self.sync_group: SyncGroup | None = None

    def _end_ids(self, sampling: SamplingSettings) -> frozenset[int]:
        if sampling.stop_token_ids:
            return frozenset(sampling.stop_token_ids)
        return frozenset() if self.eos is None else frozenset({self.eos})

    def _wrote_stop(self, out: list[int], stop: tuple[str, ...]) -> bool:
        """Whether the response's text now contains a stop string. Only its tail is decoded (a token is at
        least one character, so a stop string fits in its length in tokens), and it must end in the last
        token's text: a string that completed earlier would have stopped the response then."""
        if not stop:
            return False
        tail = out[-(max(len(s) for s in stop) + 1) :]
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        before = self.tokenizer.decode(tail[:-1], skip_special_tokens=False)
        return any(s in text and s not in before for s in stop)

    @torch.no_grad()
    def _sample_one(
        self, request: GenerationRequest, sampling: SamplingSettings
    ) -> tuple[list[int], list[float], str]:
        """The response's ids, their raw log-probs, and why it ended (vLLM's finish reasons)."""
        generator = torch.Generator(device=self.device).manual_seed(request.seed)
        ids = torch.tensor([list(request.prompt_ids)], device=self.device)
        ends = self._end_ids(sampling)
        past = None
        out: list[int] = []
        logprobs: list[float] = []
        step_input = ids
        for _ in range(sampling.max_new_tokens):
            result = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
            past = result.past_key_values
            raw = torch.log_softmax(result.logits[0, -1].float(), dim=-1)
            if sampling.greedy:
                token = int(raw.argmax())
            else:
                logits = result.logits[0, -1].float()
                if sampling.top_k > 0:
                    logits = _top_k(logits, sampling.top_k)
                probs = torch.softmax(logits / sampling.temperature, dim=-1)
                if sampling.top_p < 1.0:
                    probs = _top_p(probs, sampling.top_p)
                token = int(torch.multinomial(probs, 1, generator=generator))
            out.append(token)
            logprobs.append(float(raw[token]))
            if token in ends or self._wrote_stop(out, sampling.stop):
                return out, logprobs, "stop"
            step_input = torch.tensor([[token]], device=self.device)
        return out, logprobs, "length"

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> Iterator[list[RolloutSample]]:
        for request in requests:  # one sample at a time: each is out as soon as it is sampled
            ids, logprobs, finish = self._sample_one(request, sampling)
            yield [
                RolloutSample(
                    sample_id=request.sample_id,
                    prompt_ids=list(request.prompt_ids),
                    response_ids=ids,
                    logprobs=logprobs if sampling.logprobs else None,
                    route=request.route,
                    answer=request.answer,
                    policy_version=self.policy_version,
                    finish_reason=finish,
                )
            ]

    def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        state = {name: tensor for name, tensor in weights}
        self.model.load_state_dict(state, strict=False)
        self.policy_version = version

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, names: Sequence[str], timeout_s: float
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.sync_group = SyncGroup(host, port, first_rank, names, device=self.device, timeout=timeout)

    @torch.no_grad()
    def receive_weights(self, metas: Sequence[TensorMeta], bucket_bytes: int, version: int) -> None:
        """Each tensor is copied into the model's own as it arrives (tied weights share one storage)."""
        if self.sync_group is None:
            raise RuntimeError("weight sync: join_weight_sync was not called")
        state = self.model.state_dict()
        for name, tensor in self.sync_group.receive(metas, bucket_bytes):
            state[name].copy_(tensor)
        self.policy_version = version

    @torch.no_grad()
    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        ids = torch.tensor([[*prompt_ids, *response_ids]], device=self.device)
        logits = self.model(input_ids=ids).logits[0].float()
        p = len(prompt_ids)
        logp = torch.log_softmax(logits[p - 1 : -1], dim=-1)
        return logp.gather(-1, torch.tensor(response_ids, device=self.device)[:, None])[:, 0].tolist()

    def sleep(self) -> None:
        """Nothing to release: the fallback engine keeps its weights."""

    def wake_up(self) -> None:
        """Nothing to restore."""


def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits outside the k largest set to -inf (ties at the k-th kept, as vLLM)."""
    if k >= logits.numel():
        return logits
    kth = logits.topk(k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
    filtered = torch.zeros_like(probs).scatter(0, order, sorted_probs * keep)
    return filtered / filtered.sum()
