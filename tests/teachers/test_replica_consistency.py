"""The start-up check that a teacher's replicas agree (`teachers.consistency`), against real teacher servers:
the session's server (tiny model, seed 0), the same server behind a loopback proxy (a second endpoint of
the same weights, as `test_faults` stands in for replicas), and a second server of another checkpoint (seed
1, the same tokenizer). Each replica is sent the probe directly, so the one serving other weights is named,
even when the pool's round robin would have spread the traffic over both."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from distillery_runtime.teachers.checks.consistency import (
    TeacherInconsistentError,
    check_after_wake,
    check_replicas,
    check_teacher_replicas,
    probe_request,
    replica_label,
    replica_urls,
)
from distillery_runtime.testing.teacher_server import (
    TeacherServerProcess,
    cpu_engine,
    start_teacher_server,
)
from transformers import AutoTokenizer

from distillery.api.spec import Placement
from distillery.runtime_config import ResolvedTeacher, RuntimeConfig, TeacherProtocol
from distillery.validation import load_job

from ..conftest import CACHE, ROOT, SERVER_MAX_LOGPROBS, SERVER_MAX_MODEL_LEN, SERVER_MODEL_NAME, cpu_env
from .fault_proxy import FaultProxy

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ENGINE = cpu_engine(SERVER_MODEL_NAME, max_model_len=SERVER_MAX_MODEL_LEN, max_logprobs=SERVER_MAX_LOGPROBS)


@pytest.fixture(scope="module")
def other_weights(tiny_model_factory, tmp_path_factory) -> Iterator[TeacherServerProcess]:
    """A teacher server like the session's, serving another checkpoint (seed 1) under the same name."""
    model_dir = tiny_model_factory(vocab_size=1024, hidden=128, layers=2, heads=4, seed=1)
    env = cpu_env(CACHE)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
    log_path = tmp_path_factory.mktemp("other-weights") / "server.log"
    server = start_teacher_server(model_dir, ENGINE, log_path=log_path, env=env)
    try:
        yield server
    finally:
        server.stop()


def _teacher(endpoints: list[str]) -> ResolvedTeacher:
    return ResolvedTeacher(
        name="judge",
        placement=Placement.STANDALONE,
        protocol=TeacherProtocol.COMPACT,
        endpoints=endpoints,
        served_model_name=SERVER_MODEL_NAME,
        max_logprobs=SERVER_MAX_LOGPROBS,
        max_model_len=SERVER_MAX_MODEL_LEN,
    )


def test_the_probe_is_the_students_tokens_after_its_bos(vllm_server) -> None:
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    probe = probe_request(tokenizer)
    assert list(probe.prompt_ids) == [tokenizer.bos_token_id]
    assert 8 <= len(probe.response_ids) <= 32 and tokenizer.unk_token_id not in probe.response_ids


async def test_replicas_of_one_checkpoint_agree_and_one_that_cannot_score_is_said_not_fatal(
    vllm_server,
) -> None:
    proxy = await FaultProxy("127.0.0.1", int(vllm_server.url.rsplit(":", 1)[1])).start()
    # Answers, but not as a teacher server (404): said and left out at once, with no retries to wait for.
    dead = f"{vllm_server.url}/not-a-teacher"
    said: list[str] = []
    try:
        await check_replicas(
            _teacher([vllm_server.url, proxy.url, dead]),
            ENGINE,
            probe_request(AutoTokenizer.from_pretrained(vllm_server.model_dir)),
            label="spec.teachers[0] (judge)",
            say=said.append,
        )
    finally:
        await proxy.stop()
    assert proxy.counts["ok"] == 1  # the proxied replica was asked itself, once
    assert any(f"replica {dead} could not score the start-up probe" in line for line in said), said
    assert said[-1] == "teacher judge: its 2 replicas agree on the start-up probe", said


async def test_a_replica_serving_other_weights_is_named_and_refused(vllm_server, other_weights) -> None:
    with pytest.raises(TeacherInconsistentError) as refused:
        await check_replicas(
            _teacher([vllm_server.url, other_weights.url]),
            ENGINE,
            probe_request(AutoTokenizer.from_pretrained(vllm_server.model_dir)),
            label="spec.teachers[0] (judge)",
            say=lambda line: None,
        )
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("spec.teachers[0] (judge): its replicas score the start-up probe differently: ")
    assert f"replica {other_weights.url} differs from replica {vllm_server.url} by " in message


async def test_a_run_whose_teacher_has_replicas_of_two_checkpoints_refuses_to_start(
    vllm_server, other_weights, tmp_path
) -> None:
    """The check the run makes (`distillery run` calls it once its teachers answer), from a job's config:
    its second teacher is the one named."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: distillery.io/v1alpha1\nkind: DistillationJob\nmetadata: {name: replicas}\nspec:\n"
        f"  student: {{model: {vllm_server.model_dir}, pool: {{workers: 1, gpusPerWorker: 0}}}}\n"
        "  teachers:\n"
        f"  - {{name: steady, model: {vllm_server.model_dir}, placement: standalone, default: true}}\n"
        f"  - {{name: judge, model: {vllm_server.model_dir}, placement: standalone, routes: [math]}}\n"
        f"  data: {{train: {{path: {data}}}}}\n"
    )
    from distillery.plan import resolve
    from distillery.runtime_config import resolve_runtime_config

    spec = load_job(str(job))
    config: RuntimeConfig = resolve_runtime_config(spec, None, in_cluster=False)
    endpoints = {"steady": [vllm_server.url], "judge": [vllm_server.url, other_weights.url]}
    config = config.model_copy(
        update={
            "teachers": [
                t.model_copy(update={"endpoints": endpoints[t.name], "protocol": TeacherProtocol.COMPACT})
                for t in config.teachers
            ]
        }
    )
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    with pytest.raises(
        TeacherInconsistentError, match=r"^spec\.teachers\[1\] \(judge\): .*" + other_weights.url
    ):
        await check_teacher_replicas(config, resolve(config.spec), tokenizer, lambda line: None)


async def test_replicas_are_every_address_behind_a_plain_http_name_and_an_https_url_as_given() -> None:
    # A headless Service's name stands for its pods: each is probed at its address, named with the Service.
    # Over https the client connects by name (the certificate's), so the URL is the one replica it sees.
    replicas = await replica_urls(_teacher(["http://localhost:8000/", "https://teacher.example:8443"]))
    assert ("http://127.0.0.1:8000", "http://localhost:8000") in replicas
    assert replicas[-1] == ("https://teacher.example:8443", "https://teacher.example:8443")
    assert replica_label(*replicas[0]).endswith(" (behind http://localhost:8000)")


def test_a_colocated_teacher_whose_weights_did_not_come_back_after_a_wake_is_refused() -> None:
    first = [-2.1, -0.4, -3.3, -1.2]
    check_after_wake("colocated", first, first)  # rounding-free on one engine: the same numbers
    check_after_wake("colocated", first, [v - 0.04 for v in first])  # within the tolerance
    lost = [-6.93] * len(first)  # -ln V everywhere: the weights were not restored
    with pytest.raises(TeacherInconsistentError, match=r"^teacher colocated: after wake-up .* not restored$"):
        check_after_wake("colocated", first, lost)
