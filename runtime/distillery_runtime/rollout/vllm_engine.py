"""The vLLM rollout engine: an in-process `vllm.LLM`, stepped by hand so that samples stream out as they
finish, with the trainer's weights loaded after each optimizer step.

A streamed weight sync goes through vLLM's weight-transfer API with our backend (`vllm_transfer.py`):
each of the engine's workers, one per tensor-parallel rank, is a rank of the sync group and loads the
buckets as they arrive (vLLM's layerwise reload: checkpoint-format names, so the Hugging Face names load
as they are, each worker keeping its shard). A sync through the object store (`update_weights`) uses the
workers' RPC `reload_weights(weights_iterator=...)`, the same reload. The prefix cache is reset after each
update: cached KV blocks were computed with the old weights.

With one tensor-parallel rank the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, uni
executor: ~3 s start on CPU, ~10 s more when compiled); with more, its workers are processes of vLLM's
own (`distillery.plan.rollout.settings.rollout_executor`). On GPU the engine sleeps while the trainer runs at the
plan's level (`RolloutSettings.sleep_level`: 2, its weights discarded, as the sync after each wake-up
overwrites them), translated by `sleep_mode.EngineSleep`, which also refuses to sample between a level-2
wake-up and the sync. On CPU it never sleeps (vLLM's CPU worker has no sleep mode).

A LoRA student's engine (`lora`) serves the base model with vLLM's LoRA enabled, and a sync carries the
adapter alone (peft's saved names): the engine's own process is the one rank of the sync group (whatever
its tensor parallelism), writes the adapter as a peft folder of its own (`training.lora.save_adapter`) and
has vLLM load it under a new id, every worker taking its shard; each request names the current adapter.
Until the first sync it samples the base, which is the adapted model (B starts at zero).
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from distillery.plan.env.vllm import tensor_parallel_env, vllm_env
from distillery.plan.lora import LoraSettings, vllm_max_lora_rank
from distillery.plan.rollout.settings import rollout_executor
from distillery.plan.rollout.sleep import SleepLevel
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.rollout.sleep_mode import EngineSleep
from distillery_runtime.sync.weight_sync import SyncGroup, TensorMeta


def _on_gpu() -> bool:
    return torch.cuda.is_available()


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
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for name, value in vllm_env(os.environ).items():
            os.environ.setdefault(name, value)
        # Only while vLLM starts its workers: another engine in this process must not inherit the binding.
        binding = (
            {}
            if _on_gpu()
            else tensor_parallel_env(tensor_parallel, sorted(os.sched_getaffinity(0)), os.environ)
        )
        import vllm.envs
        from vllm import LLM

        # vLLM caches its variables once an engine has started in a process: a later engine here (a test,
        # a notebook) must read the ones set above, not the first engine's.
        vllm.envs.disable_envs_cache()

        from distillery_runtime.rollout import vllm_transfer

        # This process's worker (uni executor) finds the backend here; vLLM's own worker processes through
        # the plugin entry point, which a caller's VLLM_PLUGINS must then name.
        vllm_transfer.register()
        plugins = os.environ.get("VLLM_PLUGINS")
        if plugins and vllm_transfer.PLUGIN not in plugins.split(","):
            os.environ["VLLM_PLUGINS"] = f"{plugins},{vllm_transfer.PLUGIN}"

        kwargs: dict = {}
        sleep_level = sleep_level if _on_gpu() else SleepLevel.NONE
        if _on_gpu():
            kwargs["gpu_memory_utilization"] = memory_fraction
            kwargs["enable_sleep_mode"] = sleep_level != SleepLevel.NONE
        else:
            # A step's prompts past the token budget get split (chunked prefill), and the sample a split
            # prompt draws is discarded by rewinding its seeded generator, which a CPU generator cannot do
            # (vLLM: "CPU Generator does not use offset"; every rollout request is seeded). Whole prompts
            # only: met with 128 samples of 54-token prompts a step (chat-math, samplesPerPrompt 4).
            kwargs["enable_chunked_prefill"] = False
            # Unchunked, the budget must hold the longest prompt (vLLM CPU's default budget is 4096).
            kwargs["max_num_batched_tokens"] = max(4096, max_model_len)
        if lora is not None:
            # One adapter at a time: each sync's replaces the last (max_cpu_loras defaults to max_loras).
            kwargs.update(enable_lora=True, max_lora_rank=vllm_max_lora_rank(lora.rank), max_loras=1)
        if enforce_eager is None:
            # CUDA graphs are most of vLLM's decode speed on GPU; on CPU, compiling costs ~10 s of start-up
            # and gains ~20-30% per decode step, which only longer jobs win back (student.rollout.enforceEager).
            enforce_eager = not _on_gpu()
        self.enforce_eager = enforce_eager
        os.environ.update(binding)
        try:
            self.llm = LLM(
                model=model_dir,
                dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                max_model_len=max_model_len,
                enforce_eager=enforce_eager,
                seed=seed,
                tensor_parallel_size=tensor_parallel,
                distributed_executor_backend=rollout_executor(tensor_parallel, on_gpu=_on_gpu()),
                weight_transfer_config={"backend": vllm_transfer.NAME},
                max_logprobs=max_logprobs,
                **kwargs,
            )
        finally:
            for name in binding:
                del os.environ[name]
        self.model_dir = model_dir
        self.lora = lora
        self.sync_ranks = 1 if lora is not None else tensor_parallel
        """Ranks this engine takes in the weight-sync group: one per worker, or this process alone for a
        LoRA adapter."""
        self.sync_group: SyncGroup | None = None
        """A LoRA engine's own end of the weight-sync group (the workers' are in vllm_transfer)."""
        self.adapter: Any = None
        """The LoRARequest of the adapter loaded last; None: the base model (before the first sync)."""
        self.adapter_root: Path | None = None
        """The folder of the adapter versions this engine wrote (the current one and the one before)."""
        if lora is not None:
            self.adapter_root = Path(tempfile.mkdtemp(prefix="distillery-lora-"))
            # Removed with the engine, or when the process exits.
            self._remove_adapters = weakref.finalize(self, shutil.rmtree, self.adapter_root, True)
        self.engine = self.llm.llm_engine
        self.policy_version = 0
        self.sleep_mode = EngineSleep(self.llm, sleep_level)
        self._counter = 0

    def _params(self, sampling: SamplingSettings, seed: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # Stop strings are matched on the text, which only detokenizing gives; the token ids that wrote one
        # stay in the response (only the text is cut), as the transformers engine keeps them.
        greedy = sampling.greedy
        return SamplingParams(
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            stop=list(sampling.stop),
            detokenize=bool(sampling.stop),
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy else sampling.top_k,
            seed=None if greedy else seed,
            # The sampled token's own log-prob (raw model log-probs: vLLM's default mode), where asked for
            # (plan.rollout.logprobs_every); greedy eval's too, for the KL of its responses under the teachers.
            logprobs=0 if sampling.logprobs else None,
            # Only a finished request's output (as `LLM.generate` asks): the default (cumulative) builds
            # every running request's output, its token list copied, at every decode iteration. The rollout
            # of the e2e bench's small bf16 student (32 x 128 tokens), alternating in one process: 1.34 ->
            # 1.30 s (bench/README.md).
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

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
                self._params(sampling, request.seed),
                lora_request=self.adapter,
            )
        while self.engine.has_unfinished_requests():
            finished = []
            for output in self.engine.step():
                if not output.finished:
                    continue
                assert isinstance(output, RequestOutput)  # a generation engine: no pooling outputs
                request = by_id.pop(output.request_id)
                completion = output.outputs[0]
                ids = list(completion.token_ids)
                logprobs = None
                if completion.logprobs is not None:
                    logprobs = [
                        # Sampled positions always carry entries (only prompt position 0 has None).
                        entry[token].logprob  # type: ignore[index]
                        for entry, token in zip(completion.logprobs, ids, strict=True)
                    ]
                finished.append(
                    RolloutSample(
                        sample_id=request.sample_id,
                        prompt_ids=list(request.prompt_ids),
                        response_ids=ids,
                        logprobs=logprobs,
                        route=request.route,
                        answer=request.answer,
                        policy_version=self.policy_version,
                        finish_reason=completion.finish_reason,
                    )
                )
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
        from vllm.lora.request import LoRARequest

        from distillery_runtime.training.lora import save_adapter

        assert self.lora is not None and self.adapter_root is not None
        folder = save_adapter(
            self.adapter_root / f"v{version}", tensors, self.lora, base_model=self.model_dir
        )
        previous = self.adapter
        if previous is not None:  # before the add: a second sync of one version takes the same id
            self.engine.remove_lora(previous.lora_int_id)
        self.adapter = LoRARequest(f"v{version}", version + 1, str(folder))
        self.engine.add_lora(self.adapter)
        kept = {folder, Path(previous.lora_path)} if previous is not None else {folder}
        for old in self.adapter_root.iterdir():
            if old not in kept:
                shutil.rmtree(old, ignore_errors=True)

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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.sleep_mode.check_ready()
        ids = [*prompt_ids, *response_ids]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        prompt = TokensPrompt(prompt_token_ids=ids)
        out = self.llm.generate([prompt], params, use_tqdm=False, lora_request=self.adapter)[0]
        entries = out.prompt_logprobs or []
        p = len(prompt_ids)
        result = []
        for i, token in enumerate(response_ids):
            row = entries[p + i]
            if row is None:  # only the first prompt position has no entries
                raise RuntimeError("vLLM returned no prompt log-probs for a response position")
            result.append(row[token].logprob)
        return result

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
        if self.lora is not None:
            self._remove_adapters()

    def sleep(self) -> None:
        self.sleep_mode.sleep()

    def wake_up(self) -> None:
        """Before the weight sync (at level 2 the KV cache wakes once the sync has loaded the weights)."""
        self.sleep_mode.wake_up()
