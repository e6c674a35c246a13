"""What a cluster provides, made locally: an embedded Ray, and standalone teachers as teacher-server
subprocesses on loopback (reached through the compact protocol, exactly as in a cluster). Also the
bounded wait for teachers that both the local and the cluster run use.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from distillery.api.spec import Placement
from distillery.plan import resolve
from distillery.plan.env.heap import kept_heap_env
from distillery.plan.env.threads import shared_host_env, turn_taking_threads_env
from distillery.plan.env.vllm import vllm_env
from distillery.plan.teachers.engines import EngineSettings
from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, TeacherProtocol
from distillery_runtime.data.uris import is_hub_id, resolve_location
from distillery_runtime.run.local_gpus import LocalGpuPlan, TeacherGpus
from distillery_runtime.run.workers import free_port


class TeachersNotReady(RuntimeError):
    """Some teacher did not answer its health check within the bounded time."""


def visible_gpus() -> list[str]:
    """This machine's CUDA devices that this process may use, as CUDA_VISIBLE_DEVICES names them."""
    import torch

    if not torch.cuda.is_available():
        return []
    count = int(torch.cuda.device_count())
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [d.strip() for d in listed.split(",") if d.strip()][:count]


@dataclass
class LocalTeachers:
    """Teacher-server subprocesses started for a local run; `stop()` ends exactly these."""

    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def teacher_server_command(
    engine: EngineSettings, model_dir: str, port: int, gpus: TeacherGpus | None = None
) -> list[str]:
    """The command of one local teacher server (the operator's Deployment runs the same module): the plan's
    engine, eager, on the GPUs and with the memory fraction `gpus` places it on (none: as configured)."""
    local = dataclasses.replace(
        engine,
        enforce_eager=True,
        on_gpu=gpus is not None,
        memory_fraction=gpus.memory_fraction if gpus is not None else engine.memory_fraction,
    )
    address = ["--model", model_dir, "--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-m", "distillery_runtime.teachers.server", *address, *local.server_args()]


def start_local_teachers(
    config: RuntimeConfig, log_dir: Path, gpus: LocalGpuPlan | None = None
) -> tuple[RuntimeConfig, LocalTeachers]:
    """Start every standalone teacher that is served (vLLM; a CPU one is a forward in the run's processes,
    `plan.scoring_engine`) on loopback (on its GPUs of `gpus`); returns the config pointing at them."""
    gpus = gpus or LocalGpuPlan()
    started = LocalTeachers()
    teachers = []
    specs = {t.name: t for t in config.spec.teachers}
    engines = resolve(config.spec).engines
    log_dir.mkdir(parents=True, exist_ok=True)
    for resolved in config.teachers:
        if resolved.placement != Placement.STANDALONE or resolved.protocol == TeacherProtocol.IN_PROCESS:
            teachers.append(resolved)
            continue
        port = free_port()
        log_path = log_dir / f"teacher-{resolved.name}.log"
        with open(log_path, "wb") as log:
            started.processes.append(
                launch_teacher_server(
                    engines[resolved.name],
                    specs[resolved.name].model,
                    port,
                    log,
                    gpus.teachers.get(resolved.name),
                )
            )
        started.logs.append(log_path)
        teachers.append(resolved.model_copy(update={"endpoints": [f"http://127.0.0.1:{port}"]}))
    return config.model_copy(update={"teachers": teachers}), started


def launch_teacher_server(
    engine: EngineSettings, model: str, port: int, log: IO[bytes] | None, gpus: TeacherGpus | None = None
) -> subprocess.Popen:
    """Start one teacher server on loopback `port` (a job's standalone teacher, or a DistillationTeacher
    for `distillery serve-teacher`), writing to `log` (None: this process's output), in its own session so
    that a Ctrl-C of the terminal reaches the caller, which stops it."""
    command = teacher_server_command(engine, resolve_location(model), port, gpus)
    # The teacher servers share the host's cores with the trainer and the rollout engine.
    env = {
        **os.environ,
        **vllm_env(os.environ),
        **turn_taking_threads_env(os.environ),
        **_hub_env(os.environ, [model]),
    }
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.devices)
    output = subprocess.STDOUT if log is not None else None
    return subprocess.Popen(command, stdout=log, stderr=output, env=env, start_new_session=True)


def health_path(teacher: ResolvedTeacher) -> str:
    # Our teacher server and vLLM serve /health; an arbitrary OpenAI-compatible server may only
    # serve the models list.
    return "/v1/models" if teacher.protocol == TeacherProtocol.OPENAI else "/health"


def ready_path(teacher: ResolvedTeacher) -> str:
    """What start-up asks a teacher: its health, or, where the key reaches it late (a shared teacher), a
    route that wants the key, so that the teacher is ready once it takes the job's key."""
    if teacher.client is not None and teacher.client.key_arrives_late:
        from distillery_runtime.teachers.wire import INFO_PATH

        return "/v1/models" if teacher.protocol == TeacherProtocol.OPENAI else INFO_PATH
    return health_path(teacher)


async def wait_for_teachers(
    config: RuntimeConfig,
    timeout: float,
    processes: LocalTeachers | None = None,
    interval: float = 1.0,
    stop: threading.Event | None = None,
) -> float:
    """Poll every HTTP teacher until it answers, at most `timeout` seconds; returns the time waited. Returns
    early, with teachers still pending, once `stop` is set (the run was interrupted while it started). A
    teacher whose certificate is not trusted or that refuses the key is not waited for: TeacherAccessError
    at once, naming it (but a shared teacher, which learns a new job's key a little after the job starts:
    its refusals are waited out within `timeout`) (`teachers.access`; the scoring client's settings, so a teacher it calls ready is one
    the client can score with)."""
    import aiohttp

    from distillery_runtime.teachers.access import client_access
    from distillery_runtime.teachers.clients.http import REFUSED_CREDENTIALS

    started = time.monotonic()
    access = {
        t.name: client_access(t.name, t.client, t.endpoints)
        for t in config.teachers
        if t.protocol != TeacherProtocol.IN_PROCESS
    }
    pending = {
        (t.name, url): url.rstrip("/") + ready_path(t)
        for t in config.teachers
        if t.protocol != TeacherProtocol.IN_PROCESS
        for url in t.endpoints
    }
    last: dict[tuple[str, str], str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while pending:
            for key, url in list(pending.items()):
                teacher = access[key[0]]
                try:
                    async with session.get(url, ssl=teacher.ssl, headers=teacher.headers) as response:
                        if response.status == 200:
                            del pending[key]
                            continue
                        if response.status in REFUSED_CREDENTIALS:
                            if not teacher.settings.key_arrives_late:
                                raise teacher.refused(url, response.status, await response.read())
                            last[key] = (
                                f"HTTP {response.status}: it does not know the job's key yet (a shared teacher "
                                "learns a new job's key within a minute or two)"
                            )
                            continue
                        last[key] = f"HTTP {response.status}"
                except aiohttp.ClientConnectorCertificateError as error:
                    raise teacher.certificate_error(url, error) from None
                except (aiohttp.ClientError, OSError, TimeoutError) as error:
                    last[key] = f"{type(error).__name__}: {error}"
            if processes is not None:
                for process, log in zip(processes.processes, processes.logs, strict=True):
                    if process.poll() is not None:
                        tail = log.read_text(errors="replace")[-2000:]
                        raise TeachersNotReady(
                            f"teacher server exited with code {process.returncode}; log {log}:\n{tail}"
                        )
            if not pending or (stop is not None and stop.is_set()):
                break
            if time.monotonic() - started > timeout:
                waiting = ", ".join(
                    f"{name} at {url} ({last.get((name, url), 'no answer')})" for name, url in pending
                )
                raise TeachersNotReady(f"teachers not ready after {timeout:.0f} s: {waiting}")
            await asyncio.sleep(interval)
    return time.monotonic() - started


def local_threads() -> int:
    """CPU threads for each compute process of a local run: what torch picks for this process (the
    physical cores it may use, or OMP_NUM_THREADS)."""
    import torch

    return int(torch.get_num_threads())


def actor_env(environ: Mapping[str, str], model_locations: Sequence[str]) -> dict[str, str]:
    """The environment of every Ray actor (rollout engine, trainer ranks, colocated teachers).

    What the driver's environment (the pod, the shell) sets wins. The hub is switched off only when the
    job names no Hugging Face id: its local models then never wait on a network the machine may lack,
    and a job of hub ids on a fresh pod can download them."""
    # The source root that holds `distillery_runtime` (this file is distillery_runtime/run/local.py), and
    # the folder above it.
    here = str(Path(__file__).resolve().parents[2])
    paths = [p for p in [here, str(Path(here).parent), environ.get("PYTHONPATH", "")] if p]
    env = {
        "PYTHONPATH": os.pathsep.join(paths),
        "VLLM_ENABLE_V1_MULTIPROCESSING": environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        **vllm_env(environ),
        "TOKENIZERS_PARALLELISM": "false",
    }
    return {**env, **_hub_env(environ, model_locations)}


def _hub_env(environ: Mapping[str, str], model_locations: Sequence[str]) -> dict[str, str]:
    if "HF_HUB_OFFLINE" in environ:
        return {"HF_HUB_OFFLINE": environ["HF_HUB_OFFLINE"]}
    if any(is_hub_id(location) for location in model_locations):
        return {}
    return {"HF_HUB_OFFLINE": "1"}


EMBEDDED_RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "enable_metrics_collection": False}
"""An embedded Ray's settings. None of a local run's actors starts in the idle workers Ray prestarts for the
first driver (three actors of the run's runtime environment made, the two prestarted workers still idle
after): those only take memory (79 MiB each) and wake up on the cores the run computes on. Nobody scrapes
Ray's own metrics in a local run (the run's metrics are its own). With a run's three actors waiting, the
Ray processes took 6.7% of a core by default and 3.8% so, on the 2-core host (`bench/ray_idle.py`); a
tiny run's peak memory 2.08-2.11 -> 1.93-1.95 GiB."""


def init_ray(address: str | None, gpus: list[str] | None = None, model_locations: Sequence[str] = ()) -> None:
    """Join a Ray cluster (address) or start an embedded one for this process. With `gpus`, the embedded
    one hands the trainer ranks those GPUs only (an empty list: none, even on a machine with GPUs).
    `model_locations`: the job's models, which decide whether the actors may reach the hub."""
    import ray

    if ray.is_initialized():
        return
    env = actor_env(os.environ, model_locations)
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True)
        return
    # Ray gives every worker OMP_NUM_THREADS=1 (it assumes one CPU per task). Locally the trainer and the
    # rollout engine take turns on the machine's cores (and vLLM's CPU worker cannot raise its thread
    # count once bound), so each gets them all: 1.4x faster rollout and 2x faster training on 2 cores;
    # their OpenMP threads keep libgomp's spin between kernels (distillery.plan.env.threads).
    env.update(shared_host_env(local_threads(), os.environ))
    # They take turns: each keeps its freed heap for its next turn instead of faulting it in afresh.
    env.update(kept_heap_env(os.environ))
    if gpus is not None and visible_gpus():
        # Ray hands out the GPUs it sees when it starts, and workers that ask for none see them all: keep
        # the standalone teachers' GPUs, and with gpusPerWorker 0 every GPU, out of the student's reach.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    start_embedded_ray(
        # "local": a new Ray of this run's own, never one found on the machine (the last `ray start`'s
        # address in /tmp/ray, or RAY_ADDRESS), which would take neither these settings nor its GPUs.
        address="local",
        num_cpus=max(os.cpu_count() or 1, 4),
        include_dashboard=False,
        runtime_env={"env_vars": env},
        log_to_driver=os.environ.get("DISTILLERY_RAY_LOGS", "0") == "1",
        configure_logging=False,
        _system_config=EMBEDDED_RAY_SYSTEM_CONFIG,
    )


RAY_STARTS = 3
"""How many times a local run starts its embedded Ray before it fails."""
RAY_START_TIMED_OUT = "timed out during startup"
"""Ray's words (`ray/_private/node.py`) for a node whose raylet never registered."""


def start_embedded_ray(**options: Any) -> None:
    """`ray.init(**options)` of an embedded Ray, made again where its start timed out.

    The raylet waits a fixed ~15 s for its dashboard agent (a Python process) to write its ports, then
    aborts (`NodeManager::WaitForDashboardAgentPorts`; no setting changes it), and `ray.init` fails "The
    current node timed out during startup". On a busy host the agent's imports take longer: local runs and
    the tests' embedded Ray failed so on the 2-core CI host (2026-12-02). The processes a failed start left
    (the GCS, the agents) are killed before the next; any other failure is raised at once."""
    import psutil
    import ray

    me = psutil.Process()
    for attempt in range(1, RAY_STARTS + 1):
        before = {child.pid for child in me.children(recursive=True)}
        try:
            ray.init(**options)
            return
        except Exception as error:
            if RAY_START_TIMED_OUT not in str(error) or attempt == RAY_STARTS:
                raise
            print(
                f"Ray's start timed out (attempt {attempt} of {RAY_STARTS}); starting it again",
                file=sys.stderr,
            )
            ray.shutdown()
            for child in me.children(recursive=True):
                if child.pid not in before:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
