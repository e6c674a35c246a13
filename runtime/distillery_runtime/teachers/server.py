"""The teacher server: vLLM's OpenAI API plus Distillery's compact scoring endpoint, one process.

Usage (this is the command the operator's teacher Deployment runs; keep it stable):

    python -m distillery_runtime.teachers.server --model DIR_OR_NAME [any `vllm serve` flag ...]

for example `--host 0.0.0.0 --port 8000 --served-model-name teacher --max-model-len 4096
--max-logprobs 128 --dtype bfloat16`. Every flag is vLLM's own (same parser as `vllm
serve`) but `--distillery-max-in-flight N`: the most sequences of compact scoring requests in the engine at
once (default: the engine's `--max-num-seqs`), shared fairly among the jobs that send them. The model may
also be given positionally. Routes:

- everything vLLM serves: `/v1/completions`, `/v1/models`, `/health`, `/metrics` (with our per-job
  `distillery_teacher_*` metrics, `server_metrics`), ...
- `POST /distillery/v1/score`: compact scoring (request and binary response format in
  `distillery_runtime.teachers.wire`), top K at most `--max-logprobs`, sequences at most
  `--max-model-len` - 1 tokens. The `X-Distillery-Job` header names the job; requests are admitted
  into the engine by job, fairly (`fair_share`), and accounted per job (`job_serving`). A request whose
  client disconnects (its timeout) is dropped from the queue or aborted in the engine, never scored.
- `GET /distillery/v1/info`: `{"model", "max_model_len", "max_logprobs", "format"}`.
- `GET /distillery/v1/vocabulary`: `{"tokens": [...]}`, the tokenizer's token at each id (null for
  holes): the trainer checks that the teacher's vocabulary extends the student's (`tokenizer_compat`).

With `$VLLM_API_KEY` set (a standalone teacher's pods get the job's key there), every route but `/health`
and `/metrics` wants `Authorization: Bearer KEY` (`server_auth`; vLLM's own check covers /v1 only); with
`$DISTILLERY_TEACHER_CLIENTS` (a shared teacher's), the key of one of the jobs in that file, and the request
is then that job's whatever its `X-Distillery-Job` header says.

Both APIs share the one `AsyncLLM` engine of the process: the compact endpoint submits its
requests with `detokenize=False` and receives the engine core's top-k tensors as arrays
(`engine_scoring`), so at large K it skips the per-entry Python objects and text decoding that
limit the OpenAI endpoint; on CPU the top-k selection itself is replaced by an exact
faster one (`fast_topk`, `DISTILLERY_FAST_TOPK=0` disables it). The route is added by wrapping vLLM's `build_app` before calling
vLLM's own `run_server`, so start-up, flags, shutdown and signals behave exactly like `vllm
serve`. The `__main__` guard matters: vLLM starts its engine process with spawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.middleware import Middleware

from distillery_runtime.teachers.checks.tokenizer_compat import tokenizer_vocabulary, vocabulary_list
from distillery_runtime.teachers.dense import check_sample, check_top_k
from distillery_runtime.teachers.in_process.engine_scoring import install_tensor_logprobs, score_sequences
from distillery_runtime.teachers.serving.fast_topk import install_fast_topk
from distillery_runtime.teachers.serving.job_serving import JobServing
from distillery_runtime.teachers.serving.server_auth import KeyGuard, key_guard_options
from distillery_runtime.teachers.serving.server_metrics import TeacherServerMetrics
from distillery_runtime.teachers.types import ScoreRequest, TeacherError
from distillery_runtime.teachers.wire import (
    INFO_PATH,
    JOB_HEADER,
    MEDIA_TYPE,
    SCORE_PATH,
    VOCABULARY_PATH,
    decode_request,
    encode_response,
    error_body,
    parse_job_header,
)

router = APIRouter()

# At import, not in main(): vLLM's engine and worker processes are spawned and re-import this
# module as `__mp_main__`, so the worker that runs the sampler gets the faster top-k too.
FAST_TOPK = install_fast_topk()


def _limits(engine) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    cfg = engine.model_config
    return int(cfg.max_model_len), int(cfg.max_logprobs)


def replica_gpus(args) -> int:  # type: ignore[no-untyped-def]
    """The accelerators one server runs its engine on: tensor x pipeline x (local) data parallel; 0 on CPU."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return 0
    dp = getattr(args, "data_parallel_size_local", None) or getattr(args, "data_parallel_size", 1) or 1
    return int(args.tensor_parallel_size or 1) * int(args.pipeline_parallel_size or 1) * int(dp)


def _serving(app: FastAPI) -> JobServing:
    """The app's fair, accounted scoring: made at the first request, when the engine's config is known."""
    serving: JobServing | None = getattr(app.state, "distillery_serving", None)
    if serving is None:
        engine = app.state.engine_client
        capacity = getattr(app.state.args, "distillery_max_in_flight", None) or int(
            engine.vllm_config.scheduler_config.max_num_seqs
        )
        serving = app.state.distillery_serving = JobServing(capacity, app.state.distillery_metrics)
    return serving


def _json(content: Any) -> Response:
    """A JSON body written by orjson (a vocabulary is ~150k strings). FastAPI's `ORJSONResponse`, which did
    this, is deprecated (FastAPI 0.136 warns, FastAPIDeprecationWarning, on each one)."""
    return Response(orjson.dumps(content), media_type="application/json")


@router.get(INFO_PATH)
async def info(request: Request) -> Response:
    engine = request.app.state.engine_client
    max_model_len, max_logprobs = _limits(engine)
    return _json(
        {
            "model": request.app.state.args.served_model_name or [request.app.state.args.model],
            "max_model_len": max_model_len,
            "max_logprobs": max_logprobs,
            "format": "DSC1",
            "fast_topk": FAST_TOPK,
        }
    )


@router.get(VOCABULARY_PATH)
async def vocabulary(request: Request) -> Response:
    engine = request.app.state.engine_client
    tokens = vocabulary_list(tokenizer_vocabulary(engine.get_tokenizer()))
    return _json({"tokens": tokens})


@router.post(SCORE_PATH)
async def score(request: Request) -> Response:
    engine = request.app.state.engine_client
    try:
        seqs, top_k = decode_request(await request.body())
        max_model_len, max_logprobs = _limits(engine)
        check_top_k(top_k, max_logprobs, "server")
        for i, s in enumerate(seqs):
            check_sample(
                ScoreRequest(s.token_ids[: s.prompt_len], s.token_ids[s.prompt_len :], s.seq_id),
                i,
                max_model_len,
                "server",
            )
    except (ValueError, TeacherError) as exc:
        return Response(
            error_body(str(exc), type(exc).__name__), status_code=400, media_type="application/json"
        )
    job = parse_job_header(request.headers.get(JOB_HEADER))
    scoring = asyncio.ensure_future(
        _serving(request.app).run(job, seqs, lambda: score_sequences(engine, seqs, top_k))
    )
    if not await _answered_before_disconnect(request, scoring):
        # Nobody reads the answer: the client gave up (its attempt's timeout) and may be sending it again.
        return Response(status_code=499)
    lengths, ids, lps, tok = scoring.result()
    return Response(encode_response(lengths, ids, lps, tok, top_k), media_type=MEDIA_TYPE)


async def _answered_before_disconnect(request: Request, scoring: asyncio.Future[Any]) -> bool:
    """Wait for `scoring`, or for the client to go away first, which cancels it: a request whose client
    stopped waiting leaves the fair queue, or is aborted in the engine, instead of being scored (and
    counted) for nobody. Without this, a client that retries after its attempt's timeout has its sequences
    scored twice, and under overload every retry adds work to the queue that made it time out.

    vLLM's own routes do the same with `with_cancellation`, which reads the request from the handler's
    arguments; here the body is read inside the handler first (the disconnect watch takes the request's
    later ASGI messages, so it may only start once the body is in)."""
    disconnect = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((scoring, disconnect), return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
        answered = scoring.done()
        if not answered:  # the client went away, or this handler was cancelled (shutdown)
            scoring.cancel()
    if answered:
        return True
    with contextlib.suppress(asyncio.CancelledError):
        await scoring  # its slot given back and its engine requests aborted before the handler returns
    return False


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed its connection (ASGI `http.disconnect`)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _with_scoring_routes(build_app, environ: Mapping[str, str] | None = None):  # type: ignore[no-untyped-def]
    """vLLM's `build_app` with our routes, and with the key check of every route (`server_auth`) where
    `$VLLM_API_KEY` or `$DISTILLERY_TEACHER_CLIENTS` is set (read from `environ`, the process's own by
    default)."""

    def build(args, *rest, **kwargs) -> FastAPI:  # type: ignore[no-untyped-def]
        app = build_app(args, *rest, **kwargs)
        app.include_router(router)
        # In the default registry, which vLLM's /metrics serves; made once, as build_app runs once.
        app.state.distillery_metrics = TeacherServerMetrics(gpus=replica_gpus(args))
        guard = key_guard_options(environ)
        if guard is not None:
            # Outermost: checked before vLLM's middleware and every route. vLLM's build has already built
            # the middleware stack (where `add_middleware` refuses): it is built again, with it, at the first
            # request.
            app.user_middleware.insert(0, Middleware(KeyGuard, **guard))
            app.middleware_stack = None
        return app

    return build


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `vllm serve` flags and serve the OpenAI API plus the compact scoring endpoint."""
    import uvloop
    from vllm.entrypoints.launchers.api_server import entry
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # On CPU, vLLM's multiprocessing mode adds a worker process beside the engine core whose
        # shared-memory reader busy-polls a whole core for 1 s after every request: on a small machine
        # that is the core the student's trainer and rollout need. Without it the model runs inside the
        # engine-core process (still separate from the API server, so serving stays responsive).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    parser = make_arg_parser(
        FlexibleArgumentParser(description="Distillery teacher server (vLLM + compact scoring)")
    )
    parser.add_argument("model_tag", nargs="?", default=None, help="model (alternative to --model)")
    parser.add_argument(
        "--distillery-max-in-flight",
        type=int,
        default=None,
        help="most sequences of compact scoring requests in the engine at once, shared fairly among jobs "
        "(default: --max-num-seqs as the engine resolved it)",
    )
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    if args.model_tag:
        args.model = args.model_tag
    if args.distillery_max_in_flight is not None and args.distillery_max_in_flight < 1:
        parser.error(f"--distillery-max-in-flight must be at least 1, not {args.distillery_max_in_flight}")
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)

    install_tensor_logprobs()
    entry.build_app = _with_scoring_routes(entry.build_app)
    uvloop.run(entry.run_server(args))


if __name__ == "__main__":
    main()
