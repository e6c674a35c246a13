"""The teacher server wants its job's key on every route but /health and /metrics (`teachers.server_auth`).

The app is the one the server runs: vLLM's own `build_app` (every OpenAI and vLLM route, vLLM's middleware)
wrapped by `server._with_scoring_routes` (the compact scoring wire, the key check), parsed from `vllm serve`
flags as `server.main` does, and asked over ASGI. No engine is started: a refused request never reaches
one, and an accepted one is shown accepted by the route's own answer (400 for a bad body, which only the
route gives), not by scoring.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from unittest import mock

import httpx
import pytest
import pytest_asyncio
from distillery_runtime.teachers.server_auth import KeyGuard
from distillery_runtime.teachers.wire import INFO_PATH, SCORE_PATH, VOCABULARY_PATH

KEY = "k3y-of-the-job-0123456789abcdefghijklmnopqrstuvw"
UNAUTHORIZED = 401


def build(environ: dict[str, str]):  # type: ignore[no-untyped-def]
    from distillery_runtime.teachers import server
    from distillery_runtime.teachers.server_metrics import TeacherServerMetrics
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
