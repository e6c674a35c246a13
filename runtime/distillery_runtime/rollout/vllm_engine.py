"""The vLLM rollout engine: an in-process `vllm.LLM`, stepped by hand so that samples stream out as they
finish, with the trainer's weights loaded after each optimizer step.

Its parts, each with one job: `vllm_start` starts the `vllm.LLM` (its environment, the weight-transfer
backend, the arguments on this device), `vllm_requests` translates the plan's sampling into vLLM's requests
and their outputs into samples, and `vllm_lora` keeps a LoRA student's adapter versions. This module holds
the engine's state and the order of its calls: sampling, weight updates, sleep.

A streamed weight sync goes through vLLM's weight-transfer API with our backend (`vllm_transfer.py`):
each of the engine's workers, one per tensor-parallel rank, is a rank of the sync group and loads the
buckets as they arrive (vLLM's layerwise reload: checkpoint-format names, so the Hugging Face names load
as they are, each worker keeping its shard). A sync through the object store (`update_weights`) uses the
workers' RPC `reload_weights(weights_iterator=...)`, the same reload. The prefix cache is reset after each
update: cached KV blocks were computed with the old weights. A LoRA student's sync carries the adapter
alone, which this process receives and loads (`vllm_lora`).

On GPU the engine sleeps while the trainer runs at the plan's level (`RolloutSettings.sleep_level`: 2, its
weights discarded, as the sync after each wake-up overwrites them), translated by `sleep_mode.EngineSleep`,
which also refuses to sample between a level-2 wake-up and the sync. On CPU it never sleeps (vLLM's CPU
worker has no sleep mode).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from distillery.plan.lora import LoraSettings
from distillery.plan.rollout.sleep import SleepLevel
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.rollout.sleep_mode import EngineSleep
from distillery_runtime.rollout.vllm_lora import AdapterVersions
from distillery_runtime.rollout.vllm_requests import (
    response_logprobs,
    rollout_sample,
    sampling_params,
    sequence_scoring_params,
)
from distillery_runtime.rollout.vllm_start import start_llm
from distillery_runtime.sync.weight_sync import SyncGroup, TensorMeta


class VllmRolloutEngine:
    """Student sampling with vLLM, in-process."""

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype,
        max_model_len: int,
        seed: int = 0,
        memory_fraction: float = 0.5,
        enforce_eager: bool | None = None,
        tensor_parallel: int = 1,
        sleep_level: SleepLevel = SleepLevel.NONE,
        lora: LoraSettings | None = None,
        max_logprobs: int = 1,
    ) -> None:
        """`sleep_level`: the plan's (`RolloutSettings.sleep_level`); taken on a GPU only, as vLLM's CPU
        build has no sleep mode. `lora`: a LoRA student's adapter, which each sync then carries alone.
        `max_logprobs`: the plan's (`RolloutSettings.max_logprobs`): the loss's topK where the engine also
        scores the student's base as a teacher (`base_rows`)."""
        started = start_llm(
            model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            memory_fraction=memory_fraction,
            enforce_eager=enforce_eager,
            tensor_parallel=tensor_parallel,
            sleep_level=sleep_level,
            lora=lora,
            max_logprobs=max_logprobs,
        )
        self.llm = started.llm
        self.enforce_eager = started.enforce_eager
        self.model_dir = model_dir
        self.lora = lora
        self.sync_ranks = 1 if lora is not None else tensor_parallel
        """Ranks this engine takes in the weight-sync group: one per worker, or this process alone for a
        LoRA adapter."""
        self.sync_group: SyncGroup | None = None
        """A LoRA engine's own end of the weight-sync group (the workers' are in vllm_transfer)."""
        self.adapter: Any = None
        """The LoRARequest of the adapter loaded last; None: the base model (before the first sync)."""
        self.adapters = AdapterVersions(self) if lora is not None else None
        """The adapter versions this engine wrote (the current one and the one before)."""
        self.engine = self.llm.llm_engine
        self.policy_version = 0
        self.sleep_mode = EngineSleep(self.llm, started.sleep_level)
        self._counter = 0

    @property
    def adapter_root(self) -> Path | None:
        """The folder of the adapter versions (None: a full student's engine)."""
        return self.adapters.root if self.adapters is not None else None

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingSettings
    ) -> Iterator[list[RolloutSample]]:
        from vllm import RequestOutput
        from vllm.inputs import TokensPrompt

        self.sleep_mode.check_ready()
        by_id: dict[str, GenerationRequest] = {}
        for request in requests:
            self._counter += 1
            request_id = f"{request.sample_id}#{self._counter}"
            by_id[request_id] = request
            self.engine.add_request(
                request_id,
                TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                sampling_params(sampling, request.seed),
                lora_request=self.adapter,
            )
        while self.engine.has_unfinished_requests():
            finished = []
            for output in self.engine.step():
                if not output.finished:
                    continue
                assert isinstance(output, RequestOutput)  # a generation engine: no pooling outputs
                request = by_id.pop(output.request_id)
                finished.append(rollout_sample(request, output, self.policy_version))
            if finished:
                yield finished

    def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        if self.lora is not None:
            self._load_adapter(weights, version)
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights)})
        self._loaded(version)

    def _loaded(self, version: int) -> None:
        self.sleep_mode.weights_loaded()
        self.llm.reset_prefix_cache()  # the cached KV blocks were computed with the old weights
        self.policy_version = version

    def _load_adapter(self, tensors: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        """A LoRA student's adapter (saved names) written as the folder of `version` and loaded under a new
        id in place of the last; the folder before the last is removed (the last stays: vLLM may reload an
        adapter from its folder)."""
        assert self.lora is not None and self.adapters is not None
        self.adapter = self.adapters.load(
            self.engine,
            tensors,
            self.lora,
            base_model=self.model_dir,
            version=version,
            previous=self.adapter,
        )

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, names: Sequence[str], timeout_s: float
    ) -> None:
        """Every worker joins the sync group: worker w as rank `first_rank + w`; for a LoRA adapter this
        process alone, as rank `first_rank`."""
        if self.lora is not None:
            timeout = datetime.timedelta(seconds=timeout_s)
            self.sync_group = SyncGroup(
                host, port, first_rank, names, device=torch.device("cpu"), timeout=timeout
            )
            return
        info = {
            "host": host,
            "port": port,
            "first_rank": first_rank,
            "names": list(names),
            "timeout_s": timeout_s,
        }
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})

    def receive_weights(self, metas: Sequence[TensorMeta], bucket_bytes: int, version: int) -> None:
        """One streamed sync: every worker loads the buckets as they arrive (all at once: a collective); a
        LoRA adapter arrives here, and is loaded once whole."""
        if self.lora is not None:
            if self.sync_group is None:
                raise RuntimeError("weight sync: join_weight_sync was not called")
            # Copies: each tensor is a view of its bucket's buffer, which the next bucket overwrites.
            received = [
                (name, tensor.clone()) for name, tensor in self.sync_group.receive(metas, bucket_bytes)
            ]
            self._load_adapter(received, version)
            self._loaded(version)
            return
        update = {"metas": [(m.name, m.shape, m.dtype) for m in metas], "bucket_bytes": bucket_bytes}
        # A worker whose bucket does not arrive raises, and ends its update session itself.
        self.llm.collective_rpc("start_weight_update")
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update})
        self.llm.collective_rpc("finish_weight_update")
        self._loaded(version)

    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        from vllm.inputs import TokensPrompt

        self.sleep_mode.check_ready()
        prompt = TokensPrompt(prompt_token_ids=[*prompt_ids, *response_ids])
        out = self.llm.generate(
            [prompt], sequence_scoring_params(), use_tqdm=False, lora_request=self.adapter
        )[0]
        return response_logprobs(out, len(prompt_ids), response_ids)

    def base_rows(self, seqs: Sequence[Any], top_k: int) -> list[tuple[Any, Any, Any]]:
        """A LoRA student's base model as a teacher (`teachers.in_process.student_base`): each sequence's
        (top-k ids, top-k log-probs, token log-prob) at its response positions, from requests that name no
        adapter, through the compact path of a teacher's own engine (`engine_scoring`)."""
        from vllm.inputs import TokensPrompt

        from distillery_runtime.teachers.in_process.engine_scoring import (
            install_tensor_logprobs,
            response_rows,
            scoring_params,
        )

        self.sleep_mode.check_ready()
        install_tensor_logprobs()
        params = scoring_params(top_k)
        rows = []
        # One request a call: with LoRA enabled, vLLM 0.32 maps prompt log-probs' logits to adapters per
        # request, not per token (vllm-project/vllm#16668): several requests in one batch fail; one broadcasts.
        for seq in seqs:
            prompt = TokensPrompt(prompt_token_ids=list(seq.token_ids))
            (out,) = self.llm.generate([prompt], params, use_tqdm=False, lora_request=None)
            rows.append(response_rows(out, seq))
        return rows

    def close(self) -> None:
        """A LoRA engine's sync group closed and its adapter folders removed (also when it is collected)."""
        if self.sync_group is not None:
            self.sync_group.close()
            self.sync_group = None
        if self.adapters is not None:
            self.adapters.close()

    def sleep(self) -> None:
        self.sleep_mode.sleep()

    def wake_up(self) -> None:
        """Before the weight sync (at level 2 the KV cache wakes once the sync has loaded the weights)."""
        self.sleep_mode.wake_up()
