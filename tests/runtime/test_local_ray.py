"""The embedded Ray of a local run gives its compute actors the machine's cores (Ray's own default for a
worker is one thread, which halved training and slowed vLLM's rollout by 1.4x on 2 cores)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.slow
def test_local_ray_actors_use_every_core(ray_local):
    @ray_local.remote(num_cpus=0)
    def threads() -> tuple[int, str | None]:
        import torch

        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")

    count, env = ray_local.get(threads.remote())
    assert env == str(count)
    if "OMP_NUM_THREADS" not in os.environ:  # a user's own setting wins
        assert count >= min(2, os.cpu_count() or 1)
