"""A job starting against a shared teacher waits until the teacher knows its key (`local.wait_for_teachers`
with `TeacherClient.key_arrives_late`): the operator adds the job's key digest to the teacher's clients
Secret and the kubelet refreshes the replicas' file a little after the job's pods start. A standalone
teacher's refusal stays final at once.

The server is the teacher's own key check (`server_auth.KeyGuard` reading a clients file) in front of a
small ASGI app, served by uvicorn on a local port; the runtime's start-up wait asks it over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from distillery_runtime.run.local import wait_for_teachers
from distillery_runtime.run.workers import free_port
from distillery_runtime.teachers.serving.server_auth import ClientKeys, KeyGuard
from distillery_runtime.teachers.types import TeacherAccessError

from distillery.plan.access.auth import clients_document, key_digest
from distillery.plan.teachers.client import TeacherClient
from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, TeacherProtocol
from distillery.validation import load_job

ROOT = Path(__file__).resolve().parents[2]
KEY = "the-jobs-own-key-" + "k" * 40
KEY_ENV = "DISTILLERY_TEACHER_TEACHER_API_KEY"


async def answer_ok(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


@contextlib.asynccontextmanager
async def teacher(clients: Path) -> AsyncIterator[str]:
    port = free_port()
    app = KeyGuard(answer_ok, clients=ClientKeys(str(clients)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def config(url: str, *, late: bool) -> RuntimeConfig:
    job = load_job(ROOT / "examples" / "shared-teacher.yaml")
    client = TeacherClient(
        field="spec.teachers[0]", tls=False, api_key_env=KEY_ENV, job_key=True, key_arrives_late=late
    )
    resolved = ResolvedTeacher(
        name="teacher", placement="shared", protocol=TeacherProtocol.COMPACT, endpoints=[url],
        served_model_name="t", max_logprobs=4, max_model_len=64, client=client,
    )  # fmt: skip
    return RuntimeConfig(job_name="uses", spec=job.spec, teachers=[resolved])


async def test_the_job_waits_until_the_shared_teacher_knows_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    clients = tmp_path / "clients.json"
    clients.write_text(clients_document({"team/other": key_digest("another-job-key")}))
    async with teacher(clients) as url:

        async def learn_the_key_later() -> None:
            await asyncio.sleep(1.5)  # the operator's write and the kubelet's refresh
            staged = tmp_path / "staged.json"
            staged.write_text(clients_document({"team/other": key_digest("x"), "team/uses": key_digest(KEY)}))
            os.replace(staged, clients)

        started = time.monotonic()
        learning = asyncio.create_task(learn_the_key_later())
        waited = await wait_for_teachers(config(url, late=True), timeout=30, interval=0.2)
        await learning
    # Not ready at /health alone (which answers without a key): ready once the key is taken.
    assert 1.5 <= waited < 30 and time.monotonic() - started >= 1.5


async def test_a_shared_teacher_that_never_learns_the_key_says_so_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    clients = tmp_path / "clients.json"
    clients.write_text(clients_document({}))
    async with teacher(clients) as url:
        with pytest.raises(
            Exception, match=r"teachers not ready after 2 s: .*does not know the job's key yet"
        ):
            await wait_for_teachers(config(url, late=True), timeout=2, interval=0.2)


async def test_a_refusal_that_cannot_resolve_itself_ends_the_start_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the key does not arrive late (a standalone or external teacher), a refusal is final."""
    monkeypatch.setenv(KEY_ENV, KEY)
    clients = tmp_path / "clients.json"
    clients.write_text(clients_document({}))
    async with teacher(clients) as url:
        # Asked where the key is wanted (the OpenAI protocol's readiness route is /v1/models).
        refused = config(url, late=False)
        refused.teachers[0] = refused.teachers[0].model_copy(update={"protocol": TeacherProtocol.OPENAI})
        started = time.monotonic()
        with pytest.raises(TeacherAccessError, match="answered HTTP 401"):
            await wait_for_teachers(refused, timeout=30, interval=0.2)
    assert time.monotonic() - started < 10
