"""Pure pieces of teacher scoring, no server: OpenAI answer alignment, padding, the wire
format, retry decisions, endpoint choice, routing, tokenizer compatibility."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import orjson
import pytest
from distillery_runtime.teachers import (
    InvalidSampleError,
    ScoreRequest,
    SequenceTooLongError,
    TokenizerMismatchError,
    TopKLimitError,
    UnknownRouteError,
    check_tokenizer_compat,
)
from distillery_runtime.teachers.clients.http import Endpoint, choose_endpoint
from distillery_runtime.teachers.clients.openai_parse import parse_completion
from distillery_runtime.teachers.clients.retry import RetryPolicy, backoff_delay, is_retryable_status
from distillery_runtime.teachers.dense import check_sample, check_top_k, pack_rows
from distillery_runtime.teachers.router import assign_routes, merge_scores
from distillery_runtime.teachers.wire import (
    WireSequence,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from distillery_runtime.testing.tiny import build_tokenizer

from distillery.plan.teachers.engines import EngineSettings
from distillery.plan.teachers.routes import RouteTable


def _entry(lp: float, rank: int) -> dict:
    return {"logprob": lp, "rank": rank, "decoded_token": "x"}


def _answer(prompt_logprobs: list) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "text": "", "prompt_logprobs": prompt_logprobs}]})


def test_openai_alignment_rules() -> None:
    # prompt [5, 6], response [7, 8, 9], K=2. Position of 7: actual token outside the top K
    # (K+1 entries, inserted first as vLLM does); of 8: actual is rank 2 and comes first in
    # dict order; of 9: actual is rank 1.
    plp = [
        None,
        {"6": _entry(-0.1, 1), "3": _entry(-2.5, 2)},  # prompt position: must be ignored
        {"7": _entry(-9.0, 40), "11": _entry(-0.5, 1), "12": _entry(-1.5, 2)},
        {"8": _entry(-1.2, 2), "13": _entry(-0.3, 1)},
        {"9": _entry(-0.2, 1), "14": _entry(-2.0, 2)},
    ]
    ids, lps, tok = parse_completion(_answer(plp), 2, [7, 8, 9], 2)
    assert ids.dtype == np.int32 and lps.dtype == np.float32 and tok.dtype == np.float32
    assert ids.tolist() == [[11, 12], [13, 8], [9, 14]]
    np.testing.assert_allclose(lps, [[-0.5, -1.5], [-0.3, -1.2], [-0.2, -2.0]], rtol=1e-6)
    np.testing.assert_allclose(tok, [-9.0, -1.2, -0.2], rtol=1e-6)


def test_openai_answer_with_wrong_length_is_refused() -> None:
    with pytest.raises(Exception, match="expected 4"):
        parse_completion(_answer([None, {"1": _entry(-1, 1)}]), 2, [3, 4], 1)
    with pytest.raises(msgspec.ValidationError):
        parse_completion(b'{"choices": [{"prompt_logprobs": [null, {"a": 1}]}]}', 1, [3], 1)


def test_pack_rows_pads_consistently_and_keeps_order() -> None:
    rows = [
        (np.ones((2, 3), np.int32), np.full((2, 3), -1.0, np.float32), np.array([-1.0, -2.0], np.float32)),
        (np.zeros((0, 3), np.int32), np.zeros((0, 3), np.float32), np.zeros(0, np.float32)),
        (np.full((4, 3), 7, np.int32), np.full((4, 3), -3.0, np.float32), np.full(4, -4.0, np.float32)),
    ]
    s = pack_rows(rows, 3, ["a", "b", "c"])
    assert s.topk_ids.shape == (3, 4, 3) and s.token_logprobs.shape == (3, 4)
    assert s.mask.tolist() == [[True, True, False, False], [False] * 4, [True] * 4]
    assert (s.topk_ids[0, 2:] == 0).all() and np.isneginf(s.topk_logprobs[0, 2:]).all()
    assert np.isneginf(s.token_logprobs[1]).all() and (s.topk_ids[2] == 7).all()
    assert s.sample_ids == ["a", "b", "c"] and s.lengths().tolist() == [2, 0, 4]
    empty = pack_rows([], 5)
    assert empty.topk_ids.shape == (0, 0, 5) and empty.mask.dtype == bool


def test_wire_round_trip_and_truncation() -> None:
    seqs = [WireSequence([1, 2, 3], 1, "a"), WireSequence([4, 5], 1, "b")]
    back, k = decode_request(encode_request(seqs, 4))
    assert back == seqs and k == 4
    rng = np.random.default_rng(0)
    lengths = np.array([2, 1], np.int32)
    ids = rng.integers(0, 100, (3, 4)).astype(np.int32)
    lps = rng.normal(size=(3, 4)).astype(np.float32)
    tok = rng.normal(size=3).astype(np.float32)
    body = encode_response(lengths, ids, lps, tok, 4)
    dl, di, dp, dt, dk = decode_response(body)
    assert dk == 4 and dl.tolist() == [2, 1]
    assert np.array_equal(di, ids) and np.array_equal(dp, lps) and np.array_equal(dt, tok)
    with pytest.raises(ValueError, match="truncated"):
        decode_response(body[:-4])
    with pytest.raises(ValueError, match="malformed"):
        decode_request(b'{"sequences": []}')


def test_retry_decisions() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    rng = random.Random(0)
    delays = [[backoff_delay(a, policy, rng) for _ in range(200)] for a in range(8)]
    assert all(0 <= d <= min(1.0, 0.1 * 2**a) for a, ds in enumerate(delays) for d in ds)
    assert max(delays[0]) < 0.1 < max(delays[3])  # grows with attempts, capped
    assert len(set(delays[5])) > 100  # jittered
    assert [s for s in (200, 400, 404, 408, 429, 500, 503, 599) if is_retryable_status(s)] == [
        408,
        429,
        500,
        503,
        599,
    ]


def test_least_outstanding_endpoint_first() -> None:
    eps = [Endpoint(f"http://e{i}", None, outstanding=n) for i, n in enumerate([3, 1, 1, 0])]
    assert choose_endpoint(eps, 0.0, 0).url == "http://e3"
    eps[3].down_until = 10.0  # cooling down after a failure: skipped
    assert {choose_endpoint(eps, 0.0, t).url for t in range(4)} == {"http://e1", "http://e2"}
    for e in eps:
        e.down_until = 10.0  # all down: still pick one rather than fail
    assert choose_endpoint(eps, 0.0, 0).url == "http://e3"


def test_limits_name_the_flag_and_the_sample() -> None:
    with pytest.raises(TopKLimitError, match="--max-logprobs 65"):
        check_top_k(65, 64, "t")
    check_top_k(64, 64, "t")
    with pytest.raises(
        SequenceTooLongError, match=r"sample s7 has 512 tokens.*limit of 511.*max_model_len 512"
    ):
        check_sample(ScoreRequest([1] * 500, [2] * 12, "s7"), 0, 512, "t")
    check_sample(ScoreRequest([1] * 500, [2] * 11, "s7"), 0, 512, "t")
    with pytest.raises(InvalidSampleError, match="empty prompt"):
        check_sample(ScoreRequest([], [2], "e"), 0, 512, "t")


def test_routing_groups_and_errors() -> None:
    samples = [ScoreRequest([1], [2], f"s{i}", r) for i, r in enumerate(["math", "code", "math", "other"])]
    with_default = RouteTable({"math": "m", "code": "c"}, default="d")
    assert assign_routes(samples, with_default) == {"m": [0, 2], "c": [1], "d": [3]}
    with pytest.raises(UnknownRouteError) as err:
        assign_routes(samples, RouteTable({"math": "m", "code": "c"}))
    assert "'other'" in str(err.value) and "['code', 'math']" in str(err.value) and "s3" in str(err.value)


def test_merge_restores_input_order() -> None:
    def part(vals: list[float], t: int):
        rows = [
            (np.full((t, 1), int(v), np.int32), np.full((t, 1), v, np.float32), np.full(t, v, np.float32))
            for v in vals
        ]
        return pack_rows(rows, 1, [str(v) for v in vals])

    merged = merge_scores([([0, 2], part([0.0, 2.0], 1)), ([1], part([1.0], 3))], 3, 1)
    assert merged.sample_ids == ["0.0", "1.0", "2.0"]
    assert merged.mask.sum(1).tolist() == [1, 3, 1]
    assert merged.token_logprobs[:, 0].tolist() == [0.0, 1.0, 2.0]


def test_tokenizer_compat() -> None:
    texts = ["12+34=46", "the student and the teacher", "7+8=15"] * 50
    student = build_tokenizer(texts, 300)
    same = build_tokenizer(texts, 300)
    check_tokenizer_compat(student, same)  # identical training: compatible
    other = build_tokenizer(["completely different words here"] * 50 + texts[:3], 300)
    with pytest.raises(
        TokenizerMismatchError, match=r"^math-teacher: token id \d+ is '.*' for the student but '.*'"
    ):
        check_tokenizer_compat(student, other, teacher_name="math-teacher")


def test_vocab_padding_is_allowed(tmp_path) -> None:
    # same tokenizer, embedding tables of different sizes (as Qwen2.5 152064 vs 151936)
    from distillery_runtime.testing.tiny import save_tiny_model
    from transformers import AutoTokenizer

    tok = build_tokenizer(["1+1=2", "the teacher"] * 20, 300)
    a = save_tiny_model(tmp_path / "a", tokenizer=tok, hidden=32, layers=1, heads=2)
    b = save_tiny_model(
        tmp_path / "b", tokenizer=tok, hidden=32, layers=1, heads=2, model_vocab_size=len(tok) + 64
    )
    check_tokenizer_compat(AutoTokenizer.from_pretrained(a), AutoTokenizer.from_pretrained(b))


async def test_headless_service_addresses_become_replicas() -> None:
    from distillery_runtime.teachers.clients.http import EndpointPool

    pool = EndpointPool(["http://localhost:8123/"], resolve_dns=True)
    await pool.refresh()
    urls = {e.url for e in pool.endpoints}
    assert "http://127.0.0.1:8123" in urls
    assert all(e.host_header == "localhost:8123" for e in pool.endpoints)
    plain = EndpointPool(["http://10.0.0.7:8000"], resolve_dns=True)
    await plain.refresh()
    assert [e.url for e in plain.endpoints] == ["http://10.0.0.7:8000"]


def test_fast_topk_is_exact() -> None:
    import torch
    from distillery_runtime.teachers.serving.fast_topk import MIN_K, cpu_topk, install_fast_topk
    from vllm.v1.sample.sampler import Sampler

    torch.manual_seed(0)
    # bf16-rounded logits make exact ties common, as in a bf16 model
    x = torch.log_softmax((torch.randn(200, 3000) * 3).bfloat16().float(), -1)
    tokens = torch.randint(0, 3000, (200,))
    for k in (MIN_K, 64):
        values, indices = cpu_topk(x, k)
        want_v, _ = torch.topk(x, k)
        assert torch.equal(values, want_v)
        assert torch.equal(x.gather(1, indices), values)  # the ids really hold those values
    before = {k: Sampler.gather_logprobs(x, k, tokens) for k in (1, 8, 64)}
    assert install_fast_topk()
    try:
        for k, want in before.items():
            got = Sampler.gather_logprobs(x, k, tokens)
            assert torch.equal(got.logprobs, want.logprobs)
            assert torch.equal(got.selected_token_ranks, want.selected_token_ranks)
            assert torch.equal(got.logprob_token_ids[:, 0], want.logprob_token_ids[:, 0])
            assert got.logprob_token_ids.dtype == want.logprob_token_ids.dtype
    finally:
        Sampler.gather_logprobs = staticmethod(Sampler.gather_logprobs.__wrapped__)  # restore for other tests


def test_teacher_survives_a_new_event_loop() -> None:
    # a trainer may restart its loop; pooled state must follow the running loop, not break
    import asyncio

    from distillery_runtime.teachers import TeacherUnavailableError
    from distillery_runtime.teachers.clients.http import EndpointPool, HttpTransport

    transport = HttpTransport(
        EndpointPool(["http://127.0.0.1:9"]), RetryPolicy(total_timeout=0.3, base_delay=0.01)
    )

    async def call() -> str:
        try:
            await transport.request("GET", "/health")
        except TeacherUnavailableError as exc:
            return str(exc)
        finally:
            await transport.close()
        return "answered"

    for _ in range(2):
        assert "http://127.0.0.1:9" in asyncio.run(call())


def test_a_colocated_teacher_asks_vllm_for_its_share_of_the_gpu_only():
    from distillery_runtime.teachers.in_process.colocated import ColocatedTeacher

    engine = EngineSettings(
        "m", 64, 2048, memory_fraction=0.4, tensor_parallel=1, dtype="bfloat16", enforce_eager=True
    )
    teacher = ColocatedTeacher("m", engine)
    limits = {"max_logprobs": 64, "max_model_len": 2048, "tensor_parallel_size": 1, "dtype": "bfloat16"}
    # vLLM's default (0.9) would not fit beside the rollout engine, which is awake at the same time.
    assert teacher.engine_options(on_gpu=True) == {
        **limits,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.4,
    }
    # On CPU vLLM sizes its KV cache by VLLM_CPU_KVCACHE_SPACE instead.
    assert teacher.engine_options(on_gpu=False) == {**limits, "enforce_eager": True}
    # Explicit engine arguments still win.
    overridden = ColocatedTeacher("m", engine, engine_kwargs={"gpu_memory_utilization": 0.3})
    assert overridden.engine_options(on_gpu=True)["gpu_memory_utilization"] == 0.3
