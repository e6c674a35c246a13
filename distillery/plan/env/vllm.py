"""The environment of every vLLM engine we start (teacher servers, colocated teachers, the rollout engine).

What the caller's environment (a pod, a shell) sets for the KV cache wins; usage statistics are always off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CPU_KV_CACHE_GIB = 1
"""vLLM's KV cache (GiB, VLLM_CPU_KVCACHE_SPACE) for an engine on CPU: tests and tiny jobs. Setting it also
keeps vLLM's CPU worker from reserving --gpu-memory-utilization of the whole machine's memory."""
CPU_KV_CACHE_VAR = "VLLM_CPU_KVCACHE_SPACE"


def cpu_kv_cache_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """VLLM_CPU_KVCACHE_SPACE: the caller's, or CPU_KV_CACHE_GIB. Found on a real node: without it vLLM's
    CPU worker wanted 90% of the node's memory and exited."""
    return {CPU_KV_CACHE_VAR: (environ or {}).get(CPU_KV_CACHE_VAR, str(CPU_KV_CACHE_GIB))}


NO_TRACKING_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
"""vLLM reports usage statistics to its maintainers unless told not to: a training cluster's pods must not
phone home (and often cannot: egress is closed), so every engine, in a pod or a process of ours, gets these."""


def vllm_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a vLLM engine's process gets: its CPU KV cache, and no usage statistics or tracking."""
    return {**cpu_kv_cache_env(environ), **NO_TRACKING_ENV}


CPU_THREADS_BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def tensor_parallel_env(
    tensor_parallel: int, cpus: Sequence[int], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """On CPU, the cores each tensor-parallel worker's threads are bound to: this process's cores `cpus`
    in contiguous, near-equal parts ("0,1|2,3"); with fewer cores than workers, they share them. The
    caller's VLLM_CPU_OMP_THREADS_BIND wins. Found here: vLLM's default binds one NUMA node per worker and
    refuses more workers than nodes, so a one-node machine could not run tensorParallel 2 at all."""
    if tensor_parallel == 1 or (environ or {}).get(CPU_THREADS_BIND_VAR):
        return {}
    n = len(cpus)
    if n < tensor_parallel:
        parts = [[cpus[rank % n]] for rank in range(tensor_parallel)]
    else:
        parts = [
            list(cpus[r * n // tensor_parallel : (r + 1) * n // tensor_parallel])
            for r in range(tensor_parallel)
        ]
    return {CPU_THREADS_BIND_VAR: "|".join(",".join(map(str, part)) for part in parts)}
