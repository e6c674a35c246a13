"""Why a starting job's pods wait for a node: their `PodScheduled` conditions, polled while the job starts.

A pod that no node admits (an untolerated taint, a node selector no node matches, not enough GPUs, CPU or
memory) stays Pending forever; the scheduler says why in the pod's `PodScheduled` condition, which the
user would otherwise have to find pod by pod. The operator lists the job's pods by its label
(`distillery.io/job`, on every pod it renders: teachers, Ray head and workers, KubeRay's submitter) only
while the job starts, every `interval` seconds, and reconciles the job when the answer changes. Pods are
listed, never watched: streaming every pod of a cluster to learn about a few is the wrong trade, and a
starting job's pods are a handful.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from distillery_operator import naming
from distillery_operator.k8s.client import ApiError
from distillery_operator.observe.summaries import JobKey, Unscheduled

log = logging.getLogger("distillery.operator")


def unscheduled_pods(pods: Iterable[Mapping[str, Any]]) -> tuple[Unscheduled, ...]:
    """The pods the scheduler found no node for (`PodScheduled` False, reason `Unschedulable`), sorted.
    A pod being deleted or already bound is not waiting."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (pod.get("spec") or {}).get("nodeName"):
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            waiting = (cond.get("type"), cond.get("status"), cond.get("reason"))
            if waiting == ("PodScheduled", "False", "Unschedulable"):
                component = (meta.get("labels") or {}).get(naming.COMPONENT_LABEL, "pod")
                message = " ".join(str(cond.get("message") or "no node fits").split())
                out.append(Unscheduled(meta.get("name", ""), component, message))
    return tuple(sorted(out))


def job_selector(job_name: str) -> str:
    """The label selector of every pod the operator renders for the job."""
    return f"{naming.JOB_LABEL}={naming.label_value(job_name)}"


ListPods = Callable[[str, str], Awaitable[list[dict[str, Any]]]]
"""(namespace, label selector) -> the pods, as JSON."""


class SchedulingWatch:
    """One polling loop per starting job; the latest unscheduled pods of each."""

    def __init__(self, list_pods: ListPods, on_change: Callable[[JobKey], None], interval: float = 10.0):
        self._list_pods = list_pods
        self._on_change = on_change
        self.interval = interval
        self._tasks: dict[JobKey, asyncio.Task[None]] = {}
        self._seen: dict[JobKey, tuple[Unscheduled, ...]] = {}

    def unscheduled(self, key: JobKey) -> tuple[Unscheduled, ...]:
        return self._seen.get(key, ())

    def sync(self, key: JobKey, watch: bool) -> None:
        """Polls the job's pods while `watch` (the job starts); stops, keeping the last answer, otherwise."""
        task = self._tasks.get(key)
        if watch and task is None:
            self._tasks[key] = asyncio.create_task(self._loop(key), name=f"scheduling {key}")
        elif not watch and task is not None:
            task.cancel()
            del self._tasks[key]
            # A job no longer starting has no pod left waiting to report (running, finished or suspended).
            if self._seen.pop(key, ()):
                self._on_change(key)

    def forget(self, key: JobKey) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        self._seen.pop(key, None)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _loop(self, key: JobKey) -> None:
        namespace, name = key
        while True:
            try:
                pods = await self._list_pods(namespace, job_selector(name))
            except ApiError as error:
                # Keep the last answer: a failed list says nothing about the pods.
                log.warning("%s/%s: listing the job's pods failed: %s", namespace, name, error)
            else:
                found = unscheduled_pods(pods)
                if found != self._seen.get(key, ()):
                    self._seen[key] = found
                    self._on_change(key)
            await asyncio.sleep(self.interval)
