"""`build_engine`: the rollout engine a job's `student.rollout.engine` names.

Its own module so that the engines depend on the contract (base.py) alone: each engine is imported only
when chosen, so a machine without vLLM can still run the transformers engine.
"""

from __future__ import annotations

import torch

from distillery.api.spec import RolloutEngine as EngineKind
from distillery.plan.lora import LoraSettings
from distillery.plan.rollout.sleep import SleepLevel
from distillery_runtime.rollout.base import RolloutEngine


def build_engine(
    kind: EngineKind,
    model_dir: str,
    *,
    dtype: torch.dtype,
    max_model_len: int,
    seed: int = 0,
    memory_fraction: float = 0.5,
    enforce_eager: bool | None = None,
    tensor_parallel: int = 1,
    decode_attention: str | None = None,
    decode_threads: int | None = None,
    sleep_level: SleepLevel = SleepLevel.NONE,
    lora: LoraSettings | None = None,
    max_logprobs: int = 1,
) -> RolloutEngine:
    """The engine named by `student.rollout.engine` (vllm or transformers). `decode_attention` and
    `decode_threads`: the transformers engine's in its decode steps; `sleep_level`: the vLLM engine's
    (`RolloutSettings`; the transformers engine never sleeps); `lora`: a LoRA student's adapter, which
    every weight sync then carries alone; `max_logprobs`: vLLM's, where it scores the student's base as a
    teacher too (`RolloutSettings.max_logprobs`)."""
    if kind == EngineKind.VLLM:
        from distillery_runtime.rollout.vllm_engine import VllmRolloutEngine

        return VllmRolloutEngine(
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
    if tensor_parallel != 1:  # the spec refuses it; a direct caller gets the same reason
        raise ValueError("tensor_parallel needs the vllm engine (the transformers engine runs on one device)")
    if kind == EngineKind.TRANSFORMERS:
        from distillery_runtime.rollout.hf_engine import TransformersRolloutEngine

        return TransformersRolloutEngine(
            model_dir,
            dtype=dtype,
            decode_attention=decode_attention,
            decode_threads=decode_threads,
            lora=lora,
        )
    raise ValueError(f"unknown rollout engine {kind!r}; known: {', '.join(EngineKind)}")
