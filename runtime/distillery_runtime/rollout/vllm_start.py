"""Starting the rollout's in-process `vllm.LLM`: its environment, our weight-transfer backend, and the
engine arguments the plan's settings translate into on this device.

With one tensor-parallel rank the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, uni
executor: ~3 s start on CPU, ~10 s more when compiled); with more, its workers are processes of vLLM's
own (`distillery.plan.rollout.settings.rollout_executor`). The engine that samples with it is
`vllm_engine.VllmRolloutEngine`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from distillery.plan.env.vllm import tensor_parallel_env, vllm_env
from distillery.plan.lora import LoraSettings, vllm_max_lora_rank
from distillery.plan.rollout.settings import rollout_executor
from distillery.plan.rollout.sleep import SleepLevel


def on_gpu() -> bool:
    return torch.cuda.is_available()


@dataclass(frozen=True)
class StartedLlm:
    """A started engine and what was decided for it on this device."""

    llm: Any
    """The `vllm.LLM`."""
    enforce_eager: bool
    sleep_level: SleepLevel
    """The plan's level on a GPU; NONE on CPU, whose vLLM build has no sleep mode."""


def device_kwargs(
    *,
    gpu: bool,
    memory_fraction: float,
    sleep_level: SleepLevel,
    max_model_len: int,
    lora: LoraSettings | None,
) -> dict[str, Any]:
    """The `vllm.LLM` arguments that depend on the device (`gpu`) and the adapter: the GPU's memory share and
    sleep mode, or on CPU whole prompts in one budget; LoRA with one adapter at a time."""
    kwargs: dict[str, Any] = {}
    if gpu:
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
    return kwargs


def start_llm(
    model_dir: str,
    *,
    dtype: torch.dtype,
    max_model_len: int,
    seed: int,
    memory_fraction: float,
    enforce_eager: bool | None,
    tensor_parallel: int,
    sleep_level: SleepLevel,
    lora: LoraSettings | None,
    max_logprobs: int,
) -> StartedLlm:
    """A `vllm.LLM` of the student in `model_dir` with our weight-transfer backend, the arguments as
    `VllmRolloutEngine` takes them."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, value in vllm_env(os.environ).items():
        os.environ.setdefault(name, value)
    gpu = on_gpu()
    # Only while vLLM starts its workers: another engine in this process must not inherit the binding.
    binding = {} if gpu else tensor_parallel_env(tensor_parallel, sorted(os.sched_getaffinity(0)), os.environ)
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

    sleep_level = sleep_level if gpu else SleepLevel.NONE
    kwargs = device_kwargs(
        gpu=gpu,
        memory_fraction=memory_fraction,
        sleep_level=sleep_level,
        max_model_len=max_model_len,
        lora=lora,
    )
    if enforce_eager is None:
        # CUDA graphs are most of vLLM's decode speed on GPU; on CPU, compiling costs ~10 s of start-up
        # and gains ~20-30% per decode step, which only longer jobs win back (student.rollout.enforceEager).
        enforce_eager = not gpu
    os.environ.update(binding)
    try:
        llm = LLM(
            model=model_dir,
            dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            seed=seed,
            tensor_parallel_size=tensor_parallel,
            distributed_executor_backend=rollout_executor(tensor_parallel, on_gpu=gpu),
            weight_transfer_config={"backend": vllm_transfer.NAME},
            max_logprobs=max_logprobs,
            **kwargs,
        )
    finally:
        for name in binding:
            del os.environ[name]
    return StartedLlm(llm=llm, enforce_eager=enforce_eager, sleep_level=sleep_level)
