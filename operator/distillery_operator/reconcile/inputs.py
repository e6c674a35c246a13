"""What the controller hears: the watches' events of DistillationJobs, DistillationTeachers and the jobs'
children, turned into the work queue's keys (with the trigger a reconcile is counted under), and the
indexes a reconcile reads (the jobs, the teachers' parsed facts, which jobs use which teacher).

`controller.Controller` is made of this part and its workers and reconcile."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any

from distillery_operator import metrics, naming
from distillery_operator.k8s.workqueue import WorkQueue
from distillery_operator.observe.summaries import (
    JobKey,
    SharedTeacherFacts,
    referenced_teachers,
    teacher_facts,
)


class ControllerInputs:
    """The inputs half of `Controller` (which sets these attributes in its `__post_init__`)."""

    jobs: dict[JobKey, dict[str, Any]]
    teachers: dict[JobKey, dict[str, Any]]
    _teacher_facts: dict[JobKey, SharedTeacherFacts]
    queue: WorkQueue[JobKey]
    _triggers: dict[JobKey, str]
    _created: dict[tuple[JobKey, str, str], float]
    _conflicts: dict[tuple[JobKey, str, str], float]
    _event_context: contextvars.Context | None

    def enqueue(self, key: JobKey, trigger: str) -> None:
        self._triggers.setdefault(key, trigger)
        self.queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self.queue))

    def child_seen(self, key: JobKey, kind: str, name: str) -> None:
        """The watch showed a child (any event): its creation is confirmed, so from now on its absence is
        a deletion to repair at once. Confirming it here, not in the next reconcile, matters when the
        child is deleted before that reconcile runs: it would never be seen, and the create-grace window
        would hold its re-creation back with nothing left to wake the job up."""
        self._created.pop((key, kind, name), None)
        self._conflicts.pop((key, kind, name), None)

    def job_of_claim(self, namespace: str, claim: str) -> JobKey | None:
        """The job whose checkpoint claim `claim` is (by name: a kept claim has no owner reference), if the
        operator knows that job."""
        for key in self.jobs:
            if key[0] == namespace and naming.checkpoint_claim(key[1]) == claim:
                return key
        return None

    def teacher_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A DistillationTeacher changed: the jobs that reference it decide again (they may wait for it,
        or be refused by it)."""
        if self._event_context is None:
            # The teachers' Events are posted from this context too (`post_event`).
            self._event_context = contextvars.copy_context()
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.teachers.pop(key, None)
            self._teacher_facts.pop(key, None)
        else:
            self.teachers[key] = dict(body)
            # Parsed once a change, not at every reconcile of every job that references it.
            self._teacher_facts[key] = teacher_facts(body)
        for job in self.jobs_using(key):
            self.enqueue(job, "DistillationTeacher")

    def jobs_using(self, teacher: JobKey) -> list[JobKey]:
        """The jobs of the teacher's namespace whose spec references the DistillationTeacher."""
        namespace, name = teacher
        return [
            key
            for key, body in self.jobs.items()
            if key[0] == namespace and name in referenced_teachers(body)
        ]

    def shared_facts(self, key: JobKey) -> dict[str, SharedTeacherFacts]:
        """The DistillationTeachers a job references that exist, by name."""
        out = {}
        for name in referenced_teachers(self.jobs.get(key) or {}):
            facts = self._teacher_facts.get((key[0], name))
            if facts is not None:
                out[name] = facts
        return out

    def job_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if self._event_context is None:
            # kopf's Event poster is reachable from its per-object handlers' context only: keep a copy.
            self._event_context = contextvars.copy_context()
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.jobs.pop(key, None)
        else:
            self.jobs[key] = dict(body)
        self.enqueue(key, "DistillationJob")
