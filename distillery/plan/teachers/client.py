"""How the job's processes talk to a served teacher: TLS and its certificate check, the API key, DNS
re-resolution. Decided here, once, for both sides that talk to one.

The runtime's scoring clients (`distillery_runtime.teachers.access`) and the operator's readiness probe
(`distillery_operator.observe.probes`) translate the same `TeacherClient` into a TLS context and headers, so the
probe never calls a teacher ready that the trainer cannot score with. The operator's RayJob renderer
translates it too: the key's environment variable and the CA's mount in the trainer pods.

The key itself never passes through here, only where it is read from: in a cluster the Secret (the
operator reads it through the API) and the trainer pods' environment variable filled from that Secret; in
a local run an environment variable the user names (`distillery run --teacher-api-key NAME=VAR`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import ConfigDict

from distillery.api import ApiModel, CaBundle, Placement, SecretKeyRef, Teacher
from distillery.api.pod import OPERATOR_ENV_PREFIX
from distillery.plan.access.auth import teacher_key

TEACHER_ACCESS_DIR = "/etc/distillery-teachers"
"""In the trainer pods, where each external teacher's CA bundle is mounted: DIR/NAME/ca.crt."""
CA_FILE = "ca.crt"


class TeacherClient(ApiModel):
    """The client settings of one served teacher. No secret in it: names of where they are read."""

    model_config = ConfigDict(frozen=True)

    field: str
    """The teacher's place in the spec (`spec.teachers[0]`), which messages name."""
    tls: bool
    """https: SNI and the certificate checked against the endpoint's host name, always."""
    ca_file: str | None = None
    """The PEM bundle of CAs the runtime trusts for this teacher (None: the system's CAs)."""
    ca_bundle: CaBundle | None = None
    """Where that bundle is in the cluster: the operator's probe reads it there, the renderer mounts it."""
    api_key_env: str | None = None
    """The environment variable the runtime reads the API key from (None: no key is sent)."""
    api_key_secret: SecretKeyRef | None = None
    """Where the key is in the cluster: the operator's probe reads it there, the renderer maps it to
    `api_key_env`."""
    job_key: bool = False
    """The key is the job's own teacher key (a standalone or shared teacher's, `plan.job_access`), not one
    the spec names."""
    key_arrives_late: bool = False
    """The teacher learns the key after the job's pods start: a shared teacher reads its jobs' key digests
    from a Secret that the operator updates and the kubelet refreshes in its replicas (about a minute), so
    a refusal while the job starts is waited out, not final."""
    resolve_dns: bool = False
    """Spread over every address behind the host name, re-resolved (a headless Service's pods). Plain http
    only: it connects to an address, and TLS checks the certificate of the name it connects to."""

    def key_origin(self) -> str:
        """Where the key sent comes from, for messages (never the key)."""
        if self.api_key_secret is not None and self.job_key:
            return (
                f"the job's teacher key (Secret {self.api_key_secret.name}, key {self.api_key_secret.key}, "
                "made by the operator)"
            )
        if self.api_key_secret is not None:
            return (
                f"the API key of {self.field}.external.apiKeySecret "
                f"(Secret {self.api_key_secret.name}, key {self.api_key_secret.key})"
            )
        if self.api_key_env is not None:
            return f"the API key in ${self.api_key_env}"
        return f"no API key ({self.field}.external.apiKeySecret names none)"

    def ca_origin(self) -> str:
        """Which CAs the certificate is checked against, for messages."""
        if self.ca_bundle is not None:
            where = (
                f"Secret {self.ca_bundle.secret_name}"
                if self.ca_bundle.secret_name
                else f"ConfigMap {self.ca_bundle.config_map_name}"
            )
            return f"the CAs of {self.field}.external.caBundle ({where}, key {self.ca_bundle.key})"
        if self.ca_file is not None:
            return f"the CAs in {self.ca_file}"
        return f"the system's CAs ({self.field}.external.caBundle names none)"


@dataclass(frozen=True)
class LocalAccess:
    """What a local run has instead of a cluster's Secrets for one external teacher: the environment
    variable holding its API key and the PEM file of its CAs (`--teacher-api-key`, `--teacher-ca`)."""

    api_key_env: str | None = None
    ca_file: str | None = None


class LocalAccessError(ValueError):
    """A local run lacks what an external teacher needs (or names a teacher the job has not): one line per
    problem, naming the field or the flag."""


def api_key_env_name(teacher_name: str) -> str:
    """The trainer pods' variable holding a teacher's key. Teacher names are DNS labels (no `_`), unique in a
    job, so the variable names are too."""
    return f"{OPERATOR_ENV_PREFIX}{teacher_name.upper().replace('-', '_')}_API_KEY"


def ca_file_path(teacher_name: str) -> str:
    """Where the trainer pods find a teacher's CA bundle."""
    return f"{TEACHER_ACCESS_DIR}/{teacher_name}/{CA_FILE}"


def endpoint_client(field: str, endpoints: Sequence[str]) -> TeacherClient:
    """The settings of a teacher at `endpoints` that needs no CA bundle and no key: our own teacher servers
    (plain http inside the cluster), an external one that asks for neither."""
    schemes = {urlsplit(url).scheme for url in endpoints}
    if len(schemes) > 1:
        raise LocalAccessError(f"{field}: endpoints mix http and https: {list(endpoints)}")
    tls = schemes == {"https"}
    # Re-resolving puts an address in the URL; over TLS that would lose SNI and fail the name check.
    return TeacherClient(field=field, tls=tls, resolve_dns=not tls)


def teacher_client(
    teacher: Teacher,
    index: int,
    endpoints: Sequence[str],
    *,
    in_cluster: bool,
    local: LocalAccess | None = None,
    job_name: str | None = None,
) -> TeacherClient | None:
    """The client settings of `teacher` (spec.teachers[index]) at `endpoints`; None for a teacher computed
    in the run's processes (no endpoint). In a cluster, `job_name` given, a standalone teacher wants the
    job's teacher key (`plan.job_access`). Raises LocalAccessError where a local run lacks the key or the
    CA bundle the spec asks for."""
    if not endpoints:
        return None
    field = f"spec.teachers[{index}]"
    plain = endpoint_client(field, endpoints)
    tls = plain.tls
    access = teacher.external if teacher.placement == Placement.EXTERNAL else None
    ca_bundle = access.ca_bundle if access else None
    key_secret = access.api_key_secret if access else None
    local = local or LocalAccess()
    problems: list[str] = []
    job_key = teacher_key(job_name, teacher) if in_cluster and job_name is not None else None
    key_secret = key_secret or job_key
    if in_cluster:
        ca_file = ca_file_path(teacher.name) if ca_bundle else None
        key_env = api_key_env_name(teacher.name) if key_secret else None
        ca_bundle_used, key_secret_used = ca_bundle, key_secret
    else:
        ca_file, key_env = local.ca_file, local.api_key_env
        # Out of a cluster the spec's Secret and ConfigMap are not where they come from: messages name the
        # file and the variable instead.
        ca_bundle_used, key_secret_used = None, None
        if key_secret is not None and key_env is None:
            problems.append(
                f"{field}.external.apiKeySecret: a local run has no Secret to read teacher {teacher.name}'s "
                f"API key from; pass --teacher-api-key {teacher.name}=VAR, VAR an environment variable "
                "holding it"
            )
        if ca_bundle is not None and ca_file is None:
            kind = "Secret" if ca_bundle.secret_name else "ConfigMap"
            problems.append(
                f"{field}.external.caBundle: a local run has no {kind} to read teacher {teacher.name}'s CA "
                f"bundle from; pass --teacher-ca {teacher.name}=PATH, PATH a PEM file of the CAs"
            )
        if ca_file is not None and not tls:
            problems.append(
                f"--teacher-ca {teacher.name}: {field}.endpoint is plain http, which has no certificate to check"
            )
    if problems:
        raise LocalAccessError("\n".join(problems))
    return plain.model_copy(
        update={
            "ca_file": ca_file,
            "ca_bundle": ca_bundle_used,
            "api_key_env": key_env,
            "api_key_secret": key_secret_used,
            "job_key": job_key is not None,
            "key_arrives_late": job_key is not None and teacher.placement == Placement.SHARED,
        }
    )


def check_local_access(teachers: Sequence[Teacher], local: Mapping[str, LocalAccess]) -> None:
    """A local run's `--teacher-api-key` and `--teacher-ca` name external teachers of the job."""
    external = {t.name for t in teachers if t.placement == Placement.EXTERNAL}
    unknown = sorted(set(local) - external)
    if unknown:
        raise LocalAccessError(
            "\n".join(
                f"--teacher-api-key/--teacher-ca {name}: the job has no external teacher {name} "
                f"(its external teachers: {sorted(external) or 'none'})"
                for name in unknown
            )
        )
