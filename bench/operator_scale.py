"""Operator scale: N DistillationJobs created at once on the emulated API server, until all have converged.

Measures, for each N: the time until every job has its children (ConfigMap, teacher Service and
Deployment, RayJob) and a phase (converge_s), and until the operator stops writing (settled_s: the last
status refinements and Events); the operator's API requests per job until then (writes and reads); the
requests per idle job per minute afterwards; and the operator process's memory (RSS).

The peer, measured in the same run on the same emulator: the common kopf pattern - an `@kopf.on.create`
handler that creates the children and a `@kopf.timer` that polls them (GET) to refresh the status - here
with a 30 s timer. The operator runs as a separate process (`python -m distillery_cli operator`), the emulator
in this process (tests/operator/kube_emulator.py).

    python bench/operator_scale.py --quick      # N = 50, 35 s idle window (longer than the peer's timer)
    python bench/operator_scale.py              # N = 100, 500, 1000, 60 s idle window
The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import json_main  # bench/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "operator"))
for extra in (ROOT, ROOT / "operator", ROOT / "runtime"):
    sys.path.insert(0, str(extra))

NAMESPACE = "bench"
PEER_TIMER_SECONDS = 30.0


# ---------------------------------------------------------------------------------------------- the peer


def run_peer_operator(namespace: str) -> None:
    """The naive kopf operator (the peer): create handler + a polling timer per job."""
    import kopf
    import kubernetes
    from distillery_operator.k8s.client import load_configuration
    from distillery_operator.render import RenderContext, render_job

    from distillery.api import GROUP, PLURAL, VERSION, DistillationJob

    api = kubernetes.client.ApiClient(load_configuration())
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)

    @kopf.on.login()
    def login(**kwargs: Any) -> Any:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.create(GROUP, VERSION, PLURAL)
    def create(body: Any, namespace: str, patch: Any, **_: Any) -> None:
        job = DistillationJob.model_validate(dict(body))
        for obj in render_job(job, RenderContext(namespace, body["metadata"]["uid"])):
            kind = obj["kind"]
            if kind == "ConfigMap":
                core.create_namespaced_config_map(namespace, obj, _preload_content=False)
            elif kind == "Service":
                core.create_namespaced_service(namespace, obj, _preload_content=False)
            elif kind == "Deployment":
                apps.create_namespaced_deployment(namespace, obj, _preload_content=False)
            else:
                custom.create_namespaced_custom_object(
                    "ray.io", "v1", namespace, "rayjobs", obj, _preload_content=False
                )
        patch.status["phase"] = "Pending"

    @kopf.timer(GROUP, VERSION, PLURAL, interval=PEER_TIMER_SECONDS, initial_delay=PEER_TIMER_SECONDS)
    def poll(body: Any, name: str, namespace: str, patch: Any, **_: Any) -> None:
        job = DistillationJob.model_validate(dict(body))
        ready = 0
        for teacher in job.spec.teachers:
            deployment = apps.read_namespaced_deployment(f"{name}-teacher-{teacher.name}", namespace)
            ready += int((deployment.status and deployment.status.ready_replicas) or 0)
        rayjob = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", f"{name}-trainer")
        running = (rayjob.get("status") or {}).get("jobStatus") == "RUNNING"
        patch.status["phase"] = "Running" if running else ("Pending" if ready else "StartingTeachers")

    settings_hook = kopf.on.startup()

    @settings_hook
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True
        settings.posting.level = 40

    kopf.run(standalone=True, namespaces=[namespace])


# ---------------------------------------------------------------------------------------------- bench


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@functools.cache
def _template() -> str:
    return json.dumps(yaml.safe_load((ROOT / "examples" / "gkd.yaml").read_text()))


def job_manifest(index: int) -> dict[str, Any]:
    doc = json.loads(_template())
    doc["metadata"] = {"name": f"job-{index:05d}", "namespace": NAMESPACE}
    return doc


def is_bench_request(request: Any) -> bool:
    # The bench only creates DistillationJobs; everything else in the log is the operator's.
    return (
        request.resource is not None
        and request.resource.plural == "distillationjobs"
        and str(getattr(request.action, "value", request.action)).lower() == "create"
    )


def classify(requests: list[Any]) -> dict[str, int]:
    counts = {"writes": 0, "reads": 0, "watches": 0}
    for request in requests:
        action = str(getattr(request.action, "value", request.action)).lower()
        if action in ("create", "update", "delete"):
            counts["writes"] += 1
        elif action == "watch":
            counts["watches"] += 1
        else:
            counts["reads"] += 1
    return counts


async def measure(n: int, impl: str, idle_seconds: float, workdir: Path) -> dict[str, Any]:
    from kube_emulator import CONFIGMAPS, DEPLOYMENTS, DJ, RAYJOBS, SERVICES
    from operator_harness import quiet, running_cluster, spawn_operator, wait_for

    async with running_cluster(workdir, namespace=NAMESPACE) as cluster:
        emulator = cluster.emulator
        log = workdir / f"{impl}-{n}.log"
        if impl == "distillery":
            health = free_port()
            proc = spawn_operator(
                cluster, "--metrics-port", str(free_port()), "--health-port", str(health), log=log
            )
        else:
            env = {
                **cluster.env,
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator"), str(ROOT / "runtime")]),
            }
            proc = subprocess.Popen(
                [sys.executable, __file__, "--run-peer-operator", NAMESPACE],
                env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            )  # fmt: skip
        try:
            # Started: it watches the jobs.
            await wait_for(
                lambda: any(
                    r.resource is not None and r.resource.plural == "distillationjobs"
                    and str(getattr(r.action, "value", r.action)).lower() == "watch"
                    for r in emulator.api_requests()
                ),
                timeout=60, what=f"{impl} to start watching",
            )  # fmt: skip
            start_index = len(emulator.api_requests())
            started = time.monotonic()
            for index in range(n):
                await cluster.create(job_manifest(index))
            created = time.monotonic() - started

            children = [
                (CONFIGMAPS, "config"),
                (SERVICES, "teacher-teacher"),
                (DEPLOYMENTS, "teacher-teacher"),
                (RAYJOBS, "trainer"),
            ]
            pending = {f"job-{index:05d}" for index in range(n)}

            def converged() -> bool:
                # Polled from the emulator's own event loop: keep it cheap (no copies, only unfinished jobs).
                for name in list(pending):
                    job = emulator.peek(DJ, NAMESPACE, name)
                    if not job or not (job.get("status") or {}).get("phase"):
                        continue
                    if all(emulator.peek(r, NAMESPACE, f"{name}-{suffix}") for r, suffix in children):
                        pending.discard(name)
                return not pending

            await wait_for(converged, timeout=600, interval=0.25, what=f"{n} jobs to converge")
            converge_s = time.monotonic() - started
            # The tail: status refinements (e.g. "0/1 replicas ready" once the watch shows the Deployment)
            # and Events, until the operator has nothing left to write.
            # (The peer's timers never let the API server go quiet: for it, settled = converged.)
            if impl == "distillery":
                await quiet(cluster, 2.0, timeout=600)
                settled_s = time.monotonic() - started - 2.0
            else:
                await asyncio.sleep(1.0)
                settled_s = converge_s
            during = [r for r in emulator.api_requests()[start_index:] if not is_bench_request(r)]
            rss_converged = rss_mib(proc.pid)

            idle_start = len(emulator.api_requests())
            await asyncio.sleep(idle_seconds)
            idle = [r for r in emulator.api_requests()[idle_start:] if not is_bench_request(r)]
            per_idle = classify(idle)
            minutes = idle_seconds / 60
            totals = classify(during)
            return {
                "impl": impl,
                "jobs": n,
                "create_s": round(created, 2),
                "converge_s": round(converge_s, 2),
                "settled_s": round(settled_s, 2),
                "requests_per_job": round(len(during) / n, 2),
                "writes_per_job": round(totals["writes"] / n, 2),
                "reads_per_job": round(totals["reads"] / n, 2),
                "idle_window_s": idle_seconds,
                "idle_requests_per_job_min": round(len(idle) / n / minutes, 3),
                "idle_writes_per_job_min": round(per_idle["writes"] / n / minutes, 3),
                "idle_reads_per_job_min": round(per_idle["reads"] / n / minutes, 3),
                "idle_watch_requests": per_idle["watches"],
                "rss_mib": round(rss_converged, 1),
                "rss_mib_after_idle": round(rss_mib(proc.pid), 1),
            }
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [
        ("impl", 10), ("jobs", 5), ("converge_s", 10), ("settled_s", 9), ("requests_per_job", 12), ("writes_per_job", 10),
        ("reads_per_job", 9), ("idle_requests_per_job_min", 14), ("idle_reads_per_job_min", 12), ("rss_mib", 8),
    ]  # fmt: skip
    names = {"requests_per_job": "req/job", "writes_per_job": "writes/job", "reads_per_job": "reads/job",
             "idle_requests_per_job_min": "idle req/job/min", "idle_reads_per_job_min": "idle GET/job/min",
             "rss_mib": "RSS MiB"}  # fmt: skip
    print("  ".join(names.get(c, c).rjust(w) for c, w in cols))
    for row in rows:
        print("  ".join(str(row[c]).rjust(w) for c, w in cols))


async def main_async(args: argparse.Namespace) -> None:
    sizes = (
        [int(s) for s in args.sizes.split(",")] if args.sizes else ([50] if args.quick else [100, 500, 1000])
    )
    idle = args.idle_seconds if args.idle_seconds is not None else (35.0 if args.quick else 60.0)
    impls = ["distillery"] + ([] if args.no_peer else ["kopf-timer"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for impl in impls:
                if impl == "kopf-timer" and n > args.peer_max:
                    continue
                row = await measure(n, impl, idle, Path(tmp))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print_table(rows)
    ours = [r for r in rows if r["impl"] == "distillery"]
    target = next((r for r in ours if r["jobs"] == 500), None)
    summary = {
        "bench": "operator_scale",
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "results": rows,
        "target_500_jobs_under_120s": (target["converge_s"] < 120) if target else None,
        "idle_writes_zero": all(r["idle_writes_per_job_min"] == 0 for r in ours),
    }
    print(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one small size and a short idle window")
    parser.add_argument("--sizes", default=None, help="comma-separated job counts (overrides --quick)")
    parser.add_argument("--idle-seconds", type=float, default=None)
    parser.add_argument("--no-peer", action="store_true", help="skip the kopf create+timer peer")
    parser.add_argument("--peer-max", type=int, default=500, help="largest N the peer runs at")
    parser.add_argument("--run-peer-operator", metavar="NAMESPACE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_peer_operator:
        run_peer_operator(args.run_peer_operator)
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(json_main("operator_scale", main, child_flags=("--run-peer-operator",)))
