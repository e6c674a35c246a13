"""Rollout engines: the student samples its responses here (vLLM in-process, or transformers generate).

`build_engine(kind, model_dir, ...)` (factory.py) picks one; both implement `RolloutEngine` (base.py):
stream samples as they finish, take new weights after each optimizer step, report log-probs of a fixed
sequence.
"""

from distillery_runtime.rollout.base import GenerationRequest, RolloutEngine, SamplingSettings
from distillery_runtime.rollout.factory import build_engine

__all__ = ["GenerationRequest", "RolloutEngine", "SamplingSettings", "build_engine"]
