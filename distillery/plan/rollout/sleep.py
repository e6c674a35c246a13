"""How deep each engine on the student's GPUs sleeps while the student trains (vLLM sleep mode), decided
once here: the rollout engine and the colocated teachers only translate the level, the host-memory plan
counts what it keeps, and `distillery plan` prints it (`sleep_lines`).

vLLM's sleep mode (GPUs only: its CPU build has none) frees an engine's GPU memory for the trainer:
- level 1 copies the weights to host memory and back on wake-up, and discards the KV cache;
- level 2 discards the weights too; after wake-up they hold whatever the memory held until something loads
  them (vLLM keeps the model's buffers, e.g. rotary caches, in host memory and restores them itself).

The rollout engine sleeps at level 2: every wake-up is followed by the weight sync, which overwrites every
weight before the next rollout (the loop: train, wake, sync, sample), so at level 1 its weights went to host
memory and back every step only to be overwritten, and held the pod's host memory meanwhile. A colocated
teacher sleeps at level 1: nothing reloads its weights, they must survive. An engine that never sleeps (on
CPU, the transformers engines) has level 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum


class SleepLevel(IntEnum):
    """vLLM's `LLM.sleep(level=...)`; NONE: the engine never sleeps (no sleep mode enabled)."""

    NONE = 0
    OFFLOAD_WEIGHTS = 1
    DISCARD_WEIGHTS = 2


def sleep_level(*, sleeps: bool, weights_synced_after_wake: bool) -> SleepLevel:
    """The level of an engine: NONE where it does not sleep (`sleeps`: a vLLM engine on the student's GPUs);
    DISCARD_WEIGHTS where every wake-up is followed by a load of all its weights (the rollout engine's
    weight sync), so nothing is worth keeping; else OFFLOAD_WEIGHTS, the weights kept in host memory."""
    if not sleeps:
        return SleepLevel.NONE
    return SleepLevel.DISCARD_WEIGHTS if weights_synced_after_wake else SleepLevel.OFFLOAD_WEIGHTS


WHY = {
    SleepLevel.OFFLOAD_WEIGHTS: "weights kept in host memory: nothing reloads them",
    SleepLevel.DISCARD_WEIGHTS: "weights discarded: the weight sync after each wake-up overwrites them",
}


def sleep_lines(rollout: SleepLevel, teachers: Mapping[str, SleepLevel], *, one_step_off: bool) -> list[str]:
    """The sleep line of `distillery plan`: each engine's level and why (`teachers`: the colocated teachers'
    levels by name)."""
    if not rollout and not any(teachers.values()):
        return ["sleep: none (no vLLM engine on the student's GPUs; on CPU vLLM has no sleep mode)"]
    when = (
        "after the last rollout only (schedule.oneStepOff: the next rollout runs while the student trains)"
        if one_step_off
        else "while the student trains"
    )
    parts = [f"rollout engine level {int(rollout)} ({WHY[rollout]})"] if rollout else []
    parts += [
        f"colocated teacher {name} level {int(level)} ({WHY[level]})"
        for name, level in teachers.items()
        if level
    ]
    return [f"sleep {when}: " + "; ".join(parts)]
