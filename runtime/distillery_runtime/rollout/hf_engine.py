"""The transformers rollout engine: the student's forward in a decode loop of our own, the fallback where vLLM
is not installed.

A step's requests decode together, left-padded into one batch: one forward a token for every row still
sampling, and a row leaves the batch (its KV cache rows with it) when it ends, so the batch shrinks to the
long ones. The batch's KV cache is allocated once, for its longest prompt and the new tokens, and written in
place (`kv_cache`). Each row draws its tokens from its own torch generator seeded from its request, so a
sample does not depend on which other prompts share its step (the reproducibility vLLM's per-request seed
gives; as with vLLM, up to the float rounding a batched kernel may differ in). Rows are out the moment they
end, so the teacher scores them while the rest decode. Weights are loaded with `load_state_dict`, or the
engine samples with the trainer's own module where it runs in the trainer's process
(`plan.rollout_in_trainer`). A LoRA student's engine puts the adapter on its model as the trainer does
(`training.lora`) and loads the adapter alone, each tensor under peft's saved name mapped to its own key.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from distillery.plan.lora import LoraSettings
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.rollout.kv_cache import PreallocatedCache
from distillery_runtime.sync.weight_sync import SyncGroup, TensorMeta

BATCH_ROWS = 64
"""Requests decoded together: a step's requests in one batch on a tiny CPU student, and a bound on the KV
cache a batch holds on a real one (rows x (prompt + response) tokens)."""

Ended = tuple[GenerationRequest, list[int], list[float], str]
"""A request, its response's ids and raw log-probs, and why it ended (vLLM's finish reasons)."""


class TransformersRolloutEngine:
    """Student sampling with the model's forward and a KV cache, a batch of requests at a time."""

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype,
        batch_rows: int = BATCH_ROWS,
        model: Any = None,
        decode_attention: str | None = None,
        decode_threads: int | None = None,
        lora: LoraSettings | None = None,
    ) -> None:
        """`model`: a module to sample with as it is, the trainer's own where the plan puts the engine in the
        trainer's process (`plan.rollout_in_trainer`): never copied, never synced, switched to eval mode
        only while it samples. None: the student is loaded from `model_dir` in `dtype`. `decode_attention`:
        the attention implementation of the decode steps (`plan.attention.decode_attention`); None: the
        model's own. `decode_threads`: torch's intra-op threads in the decode steps
        (`plan.rollout.decode_threads`); None: the process's own. The prompts' forward always runs the
        model's own attention on the process's threads. `lora`: a LoRA student's adapter, put on the model
        loaded here (dropout off; B zero, so the base until the first sync); a `model` is taken as it is."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if model is None:
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
            if lora is not None:
                from distillery_runtime.training.lora import apply_lora

                loaded = apply_lora(loaded, lora, inference=True)
            self.model = loaded.to(self.device).eval()  # type: ignore[arg-type]  # transformers' decorated `to`
        else:
            self.device = next(model.parameters()).device
            self.model = model
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.eos = self.tokenizer.eos_token_id
        # the left padding's id: masked out, so any id does where the tokenizer names neither
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos
        self.pad: int = 0 if pad is None else pad
        self.batch_rows = batch_rows
        self.decode_attention = decode_attention
        self.decode_threads = decode_threads
        self.own_attention: str = self.model.config._attn_implementation
        self.policy_version = 0
        self.sync_ranks = 1
        self.sync_group: SyncGroup | None = None
        self.state_keys = self._state_keys(lora is not None and model is None)
        """A synced tensor's name -> the model's state key: a LoRA adapter's saved names (`training.lora`)
        mapped to its live keys; None: the names are the keys."""

    def _state_keys(self, adapter: bool) -> dict[str, str] | None:
        if not adapter:
            return None
        from distillery_runtime.training.lora import live_keys

        return live_keys(self.model.state_dict())

    def _key(self, name: str) -> str:
        return name if self.state_keys is None else self.state_keys[name]

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

    def _draw(self, logits: torch.Tensor, sampling: SamplingSettings, uniform: torch.Tensor) -> torch.Tensor:
        """One token a row from its filtered distribution: top-k (ties at the k-th kept, as vLLM), the
        temperature, top-p, then the inverse of the row's CDF at the row's `uniform` draw."""
        if 0 < sampling.top_k < logits.shape[-1]:
            kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            ordered, order = probs.sort(dim=-1, descending=True)
            kept = ordered * (ordered.cumsum(-1) - ordered < sampling.top_p)
            probs = torch.zeros_like(probs).scatter(-1, order, kept)
        cdf = probs.cumsum(-1)
        # the first token whose CDF passes the draw: never one of probability 0 (its CDF equals the one before)
        tokens = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)[:, 0]
        return tokens.clamp(max=logits.shape[-1] - 1)  # a draw that rounds up to the total

    @torch.no_grad()
    def _sample_batch(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings, threads: int
    ) -> Iterator[list[Ended]]:
        """The requests decoded together; yields the rows that end at each token, as they end. `threads`:
        the process's intra-op threads, which the prompts' forward runs on."""
        ends = self._end_ids(sampling)
        # Each row's uniform draws for its whole response, from its own generator, one call a row: on CPU
        # the same numbers in the same order as a draw a token, without a call per row at every token (32 a
        # token in the e2e bench's rollout). A row's t-th token reads column t; rows leave with their batch row.
        uniforms = (
            None
            if sampling.greedy
            else torch.stack(
                [
                    torch.rand(
                        sampling.max_new_tokens,
                        generator=torch.Generator(device=self.device).manual_seed(r.seed),
                        device=self.device,
                    )
                    for r in requests
                ]
            )
        )
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):  # left padding: every row's next token is at the end
            ids[row, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask[row, width - len(request.prompt_ids) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        outs: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        live = list(range(len(requests)))  # the request of each row still in the batch
        cache = PreallocatedCache(width + sampling.max_new_tokens)
        self._use_attention(self.own_attention)
        self._use_threads(threads)
        for t in range(sampling.max_new_tokens):
            logits = (
                self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )
            raw = torch.log_softmax(logits, dim=-1)
            tokens = raw.argmax(-1) if uniforms is None else self._draw(logits, sampling, uniforms[:, t])
            chosen = raw.gather(-1, tokens[:, None])[:, 0].tolist()
            ended: list[Ended] = []
            kept: list[int] = []
            for row, (i, token) in enumerate(zip(live, tokens.tolist(), strict=True)):
                outs[i].append(token)
                logprobs[i].append(chosen[row])
                if token in ends or self._wrote_stop(outs[i], sampling.stop):
                    ended.append((requests[i], outs[i], logprobs[i], "stop"))
                else:
                    kept.append(row)
            if ended:
                yield ended
            if not kept:
                return
            if t == 0:  # the prompts are in the cache: one row a step now
                self._use_attention(self.decode_attention)
                self._use_threads(self.decode_threads)
            if len(kept) < len(live):
                index = torch.tensor(kept, device=self.device)
                cache.batch_select_indices(index)
                tokens, mask, positions = tokens[index], mask[index], positions[index]
                uniforms = None if uniforms is None else uniforms[index]
                live = [live[row] for row in kept]
            ids = tokens[:, None]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            positions = positions[:, -1:] + 1
        yield [(requests[i], outs[i], logprobs[i], "length") for i in live]

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> Iterator[list[RolloutSample]]:
        training = self.model.training  # a shared trainer's module goes back to train mode after
        # the process's threads: the prompts' forward and whatever runs after the engine compute on them
        threads = torch.get_num_threads()
        self.model.eval()
        try:
            for first in range(0, len(requests), self.batch_rows):
                for ended in self._sample_batch(requests[first : first + self.batch_rows], sampling, threads):
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
                        for request, ids, logprobs, finish in ended
                    ]
        finally:
            self._use_attention(self.own_attention)  # the trainer sets its own per micro-batch from there
            # the teachers scored in this process, and the trainer, compute on every thread
            self._use_threads(threads)
            self.model.train(training)

    def _use_attention(self, kernel: str | None) -> None:
        """The model's attention implementation from here on (None: as it is). A model whose attention is not
        transformers' AttentionInterface cannot switch (transformers warns) and keeps its own."""
        if kernel is not None and kernel != self.model.config._attn_implementation:
            self.model.set_attn_implementation(kernel)

    @staticmethod
    def _use_threads(threads: int | None) -> None:
        """torch's intra-op threads from here on (None: as they are)."""
        if threads is not None and threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        state = {self._key(name): tensor for name, tensor in weights}
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
            state[self._key(name)].copy_(tensor)
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
