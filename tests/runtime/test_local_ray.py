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


@pytest.mark.slow
def test_local_ray_actors_keep_their_freed_heap_for_the_next_turn(ray_local):
    """`plan.host_heap`: every actor of the embedded Ray gets the kept-heap settings, and with them a turn's
    blocks come back from the heap (almost no page faults). The contrast: glibc's small defaults, set
    explicitly, map and fault in every block afresh each turn."""
    from distillery.plan.env.heap import kept_heap_env

    # Defined here so that Ray ships the class by value (the test module is not importable on its workers).
    class _Turns:
        """An async actor (Ray runs its calls on its event loop's thread, as the teacher's): each turn allocates
        a step's worth of activation-sized blocks, touches them and frees them all."""

        async def environ(self, names: list[str]) -> dict[str, str | None]:
            return {name: os.environ.get(name) for name in names}

        async def faults_per_page(self, turns: int) -> float:
            import resource

            import torch

            def turn() -> None:
                blocks = [torch.ones(1 << 20) for _ in range(20)]  # 20 blocks of 4 MiB
                del blocks

            for _ in range(2):  # the first turns grow the heap (and import what torch imports lazily)
                turn()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(turns):
                turn()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            return faults / (turns * 20 * (4 << 20) / 4096)

    names = list(kept_heap_env({}))
    kept = ray_local.remote(num_cpus=0)(_Turns).remote()
    callers = {name: os.environ[name] for name in names if name in os.environ}
    assert ray_local.get(kept.environ.remote(names)) == (callers or kept_heap_env({}))
    if not callers:  # a caller's own glibc settings win, and then measure nothing of ours
        assert ray_local.get(kept.faults_per_page.remote(8)) < 0.05
    small = {"MALLOC_ARENA_MAX": "8", "MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_MMAP_THRESHOLD_": "131072"}
    fresh = ray_local.remote(num_cpus=0, runtime_env={"env_vars": small})(_Turns).remote()
    assert ray_local.get(fresh.faults_per_page.remote(4)) > 0.9
