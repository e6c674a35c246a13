"""The teacher server wants its job's key on every route but /health and /metrics (`teachers.serving.server_auth`); a
shared teacher, one of its clients' keys, and it names the request's job after the key, whatever the
request's header claims.

The app is the one the server runs: vLLM's own `build_app` (every OpenAI and vLLM route, vLLM's middleware)
wrapped by `server._with_scoring_routes` (the compact scoring wire, the key check), parsed from `vllm serve`
flags as `server.main` does, and asked over ASGI. No engine is started: a refused request never reaches
one, and an accepted one is shown accepted by the route's own answer (400 for a bad body, which only the
route gives), not by scoring.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import pytest_asyncio
from distillery_runtime.teachers.serving.server_auth import ClientKeys, KeyGuard, key_guard_options
from distillery_runtime.teachers.wire import INFO_PATH, JOB_HEADER, SCORE_PATH, VOCABULARY_PATH

from distillery.plan.access.auth import clients_document, key_digest

KEY = "k3y-of-the-job-0123456789abcdefghijklmnopqrstuvw"
UNAUTHORIZED = 401


def build(environ: dict[str, str]):  # type: ignore[no-untyped-def]
    from distillery_runtime.teachers import server
    from distillery_runtime.teachers.serving.server_metrics import TeacherServerMetrics
    from prometheus_client import CollectorRegistry
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "tiny-teacher"])
    # Its own registry each: the server's goes in the process's default one, made once per process.
    with mock.patch.object(
        server, "TeacherServerMetrics", lambda gpus: TeacherServerMetrics(CollectorRegistry(), gpus)
    ):
        return server._with_scoring_routes(build_app, environ)(args, ("generate",))


@pytest.fixture(scope="module")
def app():  # type: ignore[no-untyped-def]
    """The server's app with a key, built once (building vLLM's takes seconds)."""
    built = build({"VLLM_API_KEY": KEY})
    built.state.engine_client = None  # no engine: a route that reaches it fails, as a 500
    return built


def connect(app) -> httpx.AsyncClient:  # type: ignore[no-untyped-def]
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://teacher")


@pytest_asyncio.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:  # type: ignore[no-untyped-def]
    async with connect(app) as c:
        yield c


ROUTES = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("POST", SCORE_PATH),
    ("GET", INFO_PATH),
    ("GET", VOCABULARY_PATH),
    # vLLM's routes outside /v1, which its own --api-key check leaves open.
    ("POST", "/tokenize"),
    ("GET", "/load"),
    ("GET", "/version"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}],
    ids=["none", "wrong", "no-scheme", "basic"],
)
async def test_every_route_refuses_a_request_without_the_right_key(
    client: httpx.AsyncClient, method: str, path: str, headers: dict[str, str]
) -> None:
    response = await client.request(method, path, headers=headers, content=b"{}")
    assert response.status_code == UNAUTHORIZED
    assert response.headers["www-authenticate"] == "Bearer"
    # The refusal echoes nothing of the request: not the key sent, not the one wanted.
    assert KEY not in response.text and "wrong" not in response.text


async def test_the_compact_and_openai_routes_take_the_right_key(client: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    # A malformed request reaches the route, which alone says why it is malformed.
    scored = await client.post(SCORE_PATH, headers=auth, content=b"not the wire format")
    assert scored.status_code == 400 and "error" in scored.json()
    # Past the key check to vLLM's route (which, without an engine, fails).
    completion = await client.post(
        "/v1/completions", headers=auth, json={"model": "tiny-teacher", "prompt": "a"}
    )
    assert completion.status_code not in (UNAUTHORIZED, 404)


async def test_health_and_metrics_answer_without_a_key_and_tell_nothing_of_it(
    client: httpx.AsyncClient,
) -> None:
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    assert KEY not in metrics.text
    # /health reaches its route without a key (which asks the engine this test does not start: a 500).
    assert (await client.get("/health")).status_code not in (UNAUTHORIZED, 404)


async def test_without_a_key_the_server_is_open_as_before() -> None:
    open_app = build({})
    open_app.state.engine_client = None
    async with connect(open_app) as c:
        scored = await c.post(SCORE_PATH, content=b"not the wire format")
    assert scored.status_code == 400


def test_an_empty_key_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"^\$VLLM_API_KEY: empty"):
        KeyGuard(lambda *a: None, "  ")  # type: ignore[arg-type]


def test_a_teacher_has_one_key_or_its_clients_keys_never_both() -> None:
    both = {"VLLM_API_KEY": KEY, "DISTILLERY_TEACHER_CLIENTS": "/etc/distillery/clients/clients.json"}
    with pytest.raises(ValueError, match="both set"):
        key_guard_options(both)
    assert key_guard_options({}) is None


# ------------------------------------------------------------------------------------ a shared teacher's
KEY_A, KEY_B = "key-of-job-a-" + "a" * 40, "key-of-job-b-" + "b" * 40


def write_clients(path: Path, clients: dict[str, str]) -> None:
    """As the kubelet updates a Secret volume: a new file put in place at once (a new inode)."""
    staged = path.with_suffix(".new")
    staged.write_text(clients_document({job: key_digest(key) for job, key in clients.items()}))
    os.replace(staged, path)


class Recorder:
    """The app behind the guard: records the job header of each request it is given."""

    def __init__(self) -> None:
        self.jobs: list[str | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        self.jobs.append(headers.get(JOB_HEADER.lower().encode(), b"").decode() or None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def ask(guard: KeyGuard, key: str | None, job_header: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if job_header is not None:
        headers[JOB_HEADER] = job_header
    transport = httpx.ASGITransport(app=guard)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://teacher") as c:
        return (await c.post(SCORE_PATH, headers=headers)).status_code


async def test_a_shared_teacher_names_each_request_after_the_job_whose_key_it_carries(tmp_path: Path) -> None:
    clients = tmp_path / "clients.json"
    write_clients(clients, {"team/a": KEY_A, "team/b": KEY_B})
    app = Recorder()
    guard = KeyGuard(app, clients=ClientKeys(str(clients)))
    # Job b's key with job a's name in the header (a forged claim, to be counted as a): served as b.
    assert await ask(guard, KEY_B, job_header="team/a") == 200
    assert await ask(guard, KEY_A) == 200
    assert app.jobs == ["team/b", "team/a"]
    # No key, a wrong one, a job's digest sent as if it were the key: refused, the app never asked.
    assert await ask(guard, None, job_header="team/a") == UNAUTHORIZED
    assert await ask(guard, "wrong") == UNAUTHORIZED
    assert await ask(guard, key_digest(KEY_A)) == UNAUTHORIZED
    assert app.jobs == ["team/b", "team/a"]


async def test_a_job_that_leaves_the_clients_file_loses_its_key_and_the_others_keep_theirs(
    tmp_path: Path,
) -> None:
    clients = tmp_path / "clients.json"
    write_clients(clients, {"team/a": KEY_A})
    guard = KeyGuard(Recorder(), clients=ClientKeys(str(clients)))
    assert await ask(guard, KEY_B) == UNAUTHORIZED  # not a client yet
    write_clients(clients, {"team/a": KEY_A, "team/b": KEY_B})
    assert await ask(guard, KEY_B) == 200  # the file read again when it changed: b is in
    write_clients(clients, {"team/b": KEY_B})  # a ended: its key revoked
    assert await ask(guard, KEY_A) == UNAUTHORIZED
    assert await ask(guard, KEY_B) == 200


@pytest.mark.parametrize("content", [None, "not json", '{"jobs": {"team/a": "not hex"}}', "[]"])
async def test_a_missing_or_broken_clients_file_lets_no_one_in(tmp_path: Path, content: str | None) -> None:
    clients = tmp_path / "clients.json"
    if content is not None:
        clients.write_text(content)
    guard = KeyGuard(Recorder(), clients=ClientKeys(str(clients)))
    assert await ask(guard, KEY_A) == UNAUTHORIZED


async def test_the_server_built_for_a_shared_teacher_takes_its_clients_keys(tmp_path: Path) -> None:
    clients = tmp_path / "clients.json"
    write_clients(clients, {"team/a": KEY_A})
    shared = build({"DISTILLERY_TEACHER_CLIENTS": str(clients)})
    shared.state.engine_client = None
    async with connect(shared) as c:
        assert (await c.post(SCORE_PATH, content=b"{}")).status_code == UNAUTHORIZED
        assert (await c.get("/v1/models")).status_code == UNAUTHORIZED
        scored = await c.post(SCORE_PATH, headers={"Authorization": f"Bearer {KEY_A}"}, content=b"bad")
        assert scored.status_code == 400  # reached the route
        assert (await c.get("/metrics")).status_code == 200
