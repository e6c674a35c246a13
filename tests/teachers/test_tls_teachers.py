"""External teachers as users run them: https with a private CA and an API key (issue 51, item 3).

A real TLS server (tls_teacher.py: a CA and a `localhost` certificate made here) in front of the session's
real vLLM teacher server. The runtime scores through it with the client settings the plan decides; a
wrong CA or a wrong key ends the run's wait at once with one line naming the teacher and the reason, not
after the retries and the outage budget; the operator's probe, from the same settings and the job's Secret
and ConfigMap, reaches the same verdicts.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distillery_operator.jobs.decide import probe_target
from distillery_operator.observe.probes import check, client_access
from distillery_runtime.run.local import wait_for_teachers
from distillery_runtime.teachers.clients.http import EndpointPool
from distillery_runtime.teachers.clients.openai_http import OpenAITeacher
from distillery_runtime.teachers.clients.outage import OutageTracker
from distillery_runtime.teachers.clients.retry import RetryPolicy
from distillery_runtime.teachers.scoring import TeacherScoring, build_client
from distillery_runtime.teachers.types import TeacherAccessError

from distillery.plan import resolve
from distillery.plan.teachers.client import LocalAccess, LocalAccessError, TeacherClient, teacher_client
from distillery.runtime_config import RuntimeConfig, resolve_runtime_config
from distillery.validation import parse_job
from tests.teachers.conftest import make_samples
from tests.teachers.tls_teacher import MODEL, TestCA, TlsTeacher

KEY = "sk-test-0123456789"
KEY_VAR = "DISTILLERY_TEST_TEACHER_KEY"
SLOW_TO_GIVE_UP = RetryPolicy(total_timeout=120.0, base_delay=0.5)
"""Retries that would take two minutes to give up: a refusal must end the wait long before."""


def job(endpoint: str, external: dict[str, Any] | None = None, model: str = MODEL) -> Any:
    teacher: dict[str, Any] = {"name": "big", "model": model, "placement": "external", "endpoint": endpoint}
    if external is not None:
        teacher["external"] = external
    return parse_job(
        {
            "apiVersion": "distillery.io/v1alpha1",
            "kind": "DistillationJob",
            "metadata": {"name": "tls", "namespace": "team-a"},
            "spec": {
                "student": {
                    "model": "Qwen/Qwen2.5-0.5B-Instruct",
                    "pool": {"workers": 1, "gpusPerWorker": 0},
                },
                "teachers": [teacher],
                "data": {"train": {"path": "/data/train.jsonl"}},
                "loss": {"mode": "forward_kl_topk", "topK": 4},
            },
        }
    )


EXTERNAL = {
    "apiKeySecret": {"name": "teacher-key", "key": "api-key"},
    "caBundle": {"configMapName": "teacher-ca"},
}


def local_config(endpoint: str, ca_file: Path | None, key_var: str | None = KEY_VAR) -> RuntimeConfig:
    """A local run's config (`distillery run --teacher-api-key big=VAR --teacher-ca big=PATH`)."""
    return resolve_runtime_config(
        job(endpoint, EXTERNAL),
        None,
        in_cluster=False,
        teacher_access={"big": LocalAccess(api_key_env=key_var, ca_file=str(ca_file) if ca_file else None)},
    )


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("teacher-ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("other-ca"), name="someone-else")


@pytest.fixture
async def gateway(ca: TestCA) -> AsyncIterator[TlsTeacher]:
    """The TLS teacher alone (it answers /v1/models itself): enough for refusals and health checks."""
    server = await TlsTeacher(ca, KEY).start()
    yield server
    await server.stop()


# ---------------------------------------------------------------------------------------------- the plan


def test_tls_is_never_traded_for_dns_re_resolution() -> None:
    https = job("https://teacher.example.com", EXTERNAL)
    client = teacher_client(https.spec.teachers[0], 0, ["https://teacher.example.com"], in_cluster=True)
    assert client == TeacherClient(
        field="spec.teachers[0]",
        tls=True,
        ca_file="/etc/distillery-teachers/big/ca.crt",
        ca_bundle=https.spec.teachers[0].external.ca_bundle,
        api_key_env="DISTILLERY_TEACHER_BIG_API_KEY",
        api_key_secret=https.spec.teachers[0].external.api_key_secret,
        resolve_dns=False,
    )
    # Plain http inside the cluster keeps spreading over a headless Service's pods.
    plain = job("http://vllm.inference.svc:8000")
    assert teacher_client(plain.spec.teachers[0], 0, ["http://vllm.inference.svc:8000"], in_cluster=True) == (
        TeacherClient(field="spec.teachers[0]", tls=False, resolve_dns=True)
    )
    with pytest.raises(ValueError, match="resolve_dns is for plain http"):
        EndpointPool(["https://teacher.example.com"], resolve_dns=True)


def test_a_local_run_names_the_flag_for_each_missing_secret() -> None:
    with pytest.raises(LocalAccessError) as refused:
        resolve_runtime_config(job("https://localhost:1", EXTERNAL), None, in_cluster=False)
    assert str(refused.value).splitlines() == [
        "spec.teachers[0].external.apiKeySecret: a local run has no Secret to read teacher big's API key "
        "from; pass --teacher-api-key big=VAR, VAR an environment variable holding it",
        "spec.teachers[0].external.caBundle: a local run has no ConfigMap to read teacher big's CA bundle "
        "from; pass --teacher-ca big=PATH, PATH a PEM file of the CAs",
    ]
    with pytest.raises(LocalAccessError, match=r"--teacher-api-key/--teacher-ca small: the job has no"):
        resolve_runtime_config(
            job("https://localhost:1"), None, in_cluster=False, teacher_access={"small": LocalAccess("V")}
        )


def test_distillery_run_takes_the_flags_and_refuses_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml
    from distillery_cli.main import build_parser
    from distillery_runtime.run.cli import EXIT_INVALID, local_teacher_access, run_command

    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(job("https://localhost:1", EXTERNAL).to_yaml_dict() | {"kind": "DistillationJob"})
    )
    args = build_parser().parse_args(
        ["run", str(path), "--teacher-api-key", "big=BIG_KEY", "--teacher-ca", "big=/ca.pem"]
    )
    assert local_teacher_access(args.teacher_api_key, args.teacher_ca) == {
        "big": LocalAccess(api_key_env="BIG_KEY", ca_file="/ca.pem")
    }
    assert run_command(build_parser().parse_args(["run", str(path)])) == EXIT_INVALID
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 2)[1] for line in lines] == [
        "spec.teachers[0].external.apiKeySecret",
        "spec.teachers[0].external.caBundle",
    ]
    assert all(line.startswith(f"{path}: ") for line in lines)


def test_the_probe_and_the_trainer_get_the_same_settings() -> None:
    """The operator's probe target and the trainer's runtime config come from one function."""
    spec_job = job("https://teacher.example.com", EXTERNAL)
    trainer = resolve_runtime_config(spec_job, "team-a", in_cluster=True).teachers[0].client
    assert probe_target(spec_job, 0, spec_job.spec.teachers[0]).client == trainer
    assert trainer is not None and trainer.tls and not trainer.resolve_dns


# ---------------------------------------------------------------------------------------------- the runtime


@pytest.mark.vllm
async def test_the_runtime_scores_through_tls_with_its_key(
    vllm_server: Any, ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await TlsTeacher(ca, KEY, upstream=vllm_server.url).start()
    try:
        monkeypatch.setenv(KEY_VAR, KEY)
        config = local_config(server.url, ca.ca_file)
        assert config.teachers[0].client is not None and not config.teachers[0].client.resolve_dns
        assert await wait_for_teachers(config, timeout=30, interval=0.2) < 30
        plan = resolve(config.spec)
        client = build_client(config.teachers[0], plan.engines["big"], retry=SLOW_TO_GIVE_UP)
        samples = make_samples(4, 1024, seed=3)
        scores = await client.score(samples, 4)
        # The same samples straight to the server: TLS and the key change nothing of the answer.
        direct = OpenAITeacher([vllm_server.url], vllm_server.model)
        want = await direct.score(samples, 4)
        np.testing.assert_array_equal(scores.mask, want.mask)
        np.testing.assert_allclose(
            scores.token_logprobs[scores.mask], want.token_logprobs[want.mask], rtol=0, atol=1e-3
        )
        await client.close()
        await direct.close()
        assert server.seen_sni == {"localhost"}  # the host name was sent, not an address
        assert server.refused == 0
    finally:
        await server.stop()


async def _refusal(config: RuntimeConfig) -> tuple[str, str]:
    """What the run's wait for teachers, and scoring past it with an outage budget of 10 minutes, say."""
    started = time.monotonic()
    with pytest.raises(TeacherAccessError) as waited:
        await wait_for_teachers(config, timeout=120, interval=0.2)
    plan = resolve(config.spec)
    client = build_client(config.teachers[0], plan.engines["big"], retry=SLOW_TO_GIVE_UP)
    scoring = TeacherScoring(plan, {"big": client}, OutageTracker(600.0))
    with pytest.raises(TeacherAccessError) as scored:
        await scoring.score_one(make_samples(1, 1024, seed=0)[0])
    await client.close()
    assert time.monotonic() - started < 10, "a refusal was retried"
    return str(waited.value), str(scored.value)


async def test_a_wrong_ca_fails_at_once_naming_the_teacher_and_why(
    gateway: TlsTeacher, other_ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR, KEY)
    for line in await _refusal(local_config(gateway.url, other_ca.ca_file)):
        assert "\n" not in line
        assert (
            line.startswith("teacher big: the TLS certificate of localhost:") and "is not trusted (" in line
        )
        assert f"checked against the CAs in {other_ca.ca_file}" in line
    assert gateway.refused == 0  # never got as far as sending the key


async def test_the_systems_cas_do_not_trust_a_private_one(gateway: TlsTeacher) -> None:
    config = resolve_runtime_config(job(gateway.url), None, in_cluster=False)
    for line in await _refusal(config):
        assert "checked against the system's CAs (spec.teachers[0].external.caBundle names none)" in line


async def test_a_wrong_key_fails_at_once_naming_the_teacher_and_why(
    gateway: TlsTeacher, ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR, "sk-wrong")
    for line in await _refusal(local_config(gateway.url, ca.ca_file)):
        assert "\n" not in line and "sk-wrong" not in line
        assert line.startswith(f"teacher big: {gateway.url}/v1/")
        assert f"answered HTTP 401, refusing the API key in ${KEY_VAR}: " in line
    assert gateway.refused >= 2


async def test_no_key_where_one_is_wanted_says_which_field_sets_it(gateway: TlsTeacher, ca: TestCA) -> None:
    config = resolve_runtime_config(
        job(gateway.url, {"caBundle": {"secretName": "ca"}}),
        None,
        in_cluster=False,
        teacher_access={"big": LocalAccess(ca_file=str(ca.ca_file))},
    )
    waited, _ = await _refusal(config)
    assert "refusing no API key (spec.teachers[0].external.apiKeySecret names none)" in waited


def test_an_unset_key_variable_is_named_before_any_request(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distillery_runtime.teachers.access import client_access as runtime_access

    monkeypatch.delenv(KEY_VAR, raising=False)
    config = local_config("https://localhost:1", ca.ca_file)
    with pytest.raises(
        TeacherAccessError, match=rf"^teacher big: \${KEY_VAR} is not set \(--teacher-api-key"
    ):
        runtime_access("big", config.teachers[0].client, config.teachers[0].endpoints)
    monkeypatch.setenv(KEY_VAR, KEY)
    access = runtime_access("big", config.teachers[0].client, config.teachers[0].endpoints)
    assert access.headers == {"Authorization": f"Bearer {KEY}"} and KEY not in repr(access)


# ---------------------------------------------------------------------------------------------- the operator


class Objects:
    """A namespace's Secrets and ConfigMaps as the probe reads them (`Kube.read_key`'s signature; the
    emulator test in tests/operator reads them through the real client)."""

    def __init__(self, **objects: dict[str, str]) -> None:
        self.objects = objects

    async def read_key(self, namespace: str, kind: str, name: str, key: str) -> str | None:
        data = self.objects.get(f"{kind}/{name}") or {}
        value = data.get(key)
        if kind == "Secret" and value is not None:  # a Secret's data is base64 in the API
            return base64.b64decode(value).decode()
        return value


async def _probe(gateway: TlsTeacher, objects: Objects) -> str:
    import aiohttp

    spec_job = job(gateway.url, EXTERNAL)
    target = probe_target(spec_job, 0, spec_job.spec.teachers[0])
    async with aiohttp.ClientSession() as session:
        try:
            context, headers = await client_access(objects.read_key, "team-a", target.client)
        except ValueError as error:
            return f"refused: {error}"
        health = await check(
            session, target.endpoint, 5.0, ssl_context=context, headers=headers, client=target.client
        )
    return ("ok: " if health.ok else "failed: ") + health.message


async def test_the_operators_probe_trusts_and_sends_what_the_trainer_does(
    gateway: TlsTeacher, ca: TestCA, other_ca: TestCA
) -> None:
    secret = {"api-key": base64.b64encode(KEY.encode() + b"\n").decode()}  # made from a file: a newline
    right = Objects(**{"Secret/teacher-key": secret, "ConfigMap/teacher-ca": {"ca.crt": ca.ca_pem}})
    assert await _probe(gateway, right) == f"ok: GET {gateway.url}/v1/models: 200"
    assert gateway.seen_sni == {"localhost"}

    wrong_key = Objects(
        **{
            "Secret/teacher-key": {"api-key": base64.b64encode(b"sk-wrong").decode()},
            "ConfigMap/teacher-ca": {"ca.crt": ca.ca_pem},
        }
    )
    said = await _probe(gateway, wrong_key)
    assert said == (
        f"failed: GET {gateway.url}/v1/models: HTTP 401, refusing the API key of "
        "spec.teachers[0].external.apiKeySecret (Secret teacher-key, key api-key)"
    )

    wrong_ca = Objects(**{"Secret/teacher-key": secret, "ConfigMap/teacher-ca": {"ca.crt": other_ca.ca_pem}})
    said = await _probe(gateway, wrong_ca)
    assert said.startswith(f"failed: GET {gateway.url}/v1/models: TLS certificate not trusted (")
    assert said.endswith(
        "checked against the CAs of spec.teachers[0].external.caBundle (ConfigMap teacher-ca, key ca.crt)"
    )

    missing = Objects(**{"ConfigMap/teacher-ca": {"ca.crt": ca.ca_pem}})
    assert await _probe(gateway, missing) == (
        "refused: spec.teachers[0].external.apiKeySecret: Secret teacher-key has no key api-key (or does not "
        "exist)"
    )
