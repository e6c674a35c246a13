"""The rollout engine's vLLM sleep and wake-up, translated from the plan's level (`distillery.plan.rollout.sleep`):
no decision here, only the calls each level needs and the one order that keeps level 2 safe.

At level 2 the engine's weights are discarded while it sleeps, and after a wake-up they hold whatever the
GPU memory held until the weight sync loads them. So a wake-up wakes the weights alone
(`wake_up(tags=["weights"])`), the sync loads them into that memory, and only then is the KV cache woken
(`wake_up(tags=["kv_cache"])`, which also resumes vLLM's scheduler): the sync's buckets and the KV cache are
never on the GPU at once (verl's order), and sampling before the sync is refused (`check_ready`), instead
of sampling from garbage. At level 1 the weights come back from host memory: one plain wake-up.
"""

from __future__ import annotations

from typing import Any

from distillery.plan.rollout.sleep import SleepLevel


class EngineSleep:
    """Sleep and wake-up of one `vllm.LLM` at the plan's level (NONE: it never sleeps)."""

    def __init__(self, llm: Any, level: SleepLevel) -> None:
        self.llm = llm
        self.level = level
        self.asleep = False
        self.awaiting_weights = False
        """Woken from level 2 and not synced since: its weights are undefined, its KV cache still asleep."""

    def sleep(self) -> None:
        # Half awake (weights woken, no sync since): its KV cache is asleep already, which vLLM cannot put to
        # sleep twice, and its weights hold nothing; it stays so until the sync.
        if self.level == SleepLevel.NONE or self.asleep or self.awaiting_weights:
            return
        self.llm.sleep(level=int(self.level))
        self.asleep = True

    def wake_up(self) -> None:
        """Before the weight sync: at level 2 the weights' memory only (the sync fills it), else all."""
        if not self.asleep:
            return
        if self.level == SleepLevel.DISCARD_WEIGHTS:
            self.llm.wake_up(tags=["weights"])
            self.awaiting_weights = True
        else:
            self.llm.wake_up()
        self.asleep = False

    def weights_loaded(self) -> None:
        """After a sync loaded every weight: the KV cache comes back (vLLM's scheduler resumes with it)."""
        if self.awaiting_weights:
            self.llm.wake_up(tags=["kv_cache"])
            self.awaiting_weights = False

    def check_ready(self) -> None:
        """Raise where sampling now would read undefined weights (woken from level 2, not synced since)."""
        if self.asleep:
            raise RuntimeError("rollout engine is asleep: wake it up (and sync its weights) before sampling")
        if self.awaiting_weights:
            raise RuntimeError(
                "rollout engine woke from sleep level 2, which discards its weights: sync them before sampling"
            )
