"""What a platform team lets a job's author choose: one check, run by `distillery validate` and by CEL.

A DistillationJob chooses the image its pods run (`spec.image`), the ServiceAccount they run as
(`spec.serviceAccountName`) and the volumes they mount (each pod section's `volumes`); a DistillationTeacher
chooses its image and its pool's volumes. The operator creates those pods with its own rights, so whoever may
create a job would otherwise run any image as any ServiceAccount of the namespace, with any of its Secrets
mounted or in its environment (`env[].valueFrom.secretKeyRef`). The chart's `admission` values (`AdmissionSettings`) bound those choices.

This module is the one source of the check. `violations()` is what `distillery validate --admission
VALUES` reports; `POLICIES` is the same check as the CEL of the chart's ValidatingAdmissionPolicies, one
per kind, written to `charts/distillery/admission/policies.yaml` (`python -m distillery.admission`), which
the chart's template reads (tests/chart fails when the file is stale). Each refusal's message is one
template, filled by Python here and by a CEL `messageExpression` there, so both say the same words.

A value is judged when it is chosen: on UPDATE, an image, ServiceAccount, Secret volume or Secret variable
the object already had passes. Otherwise a policy tightened after a job was made would refuse every later write to it
(Kueue's `suspend`, the operator's finalizer on a DistillationTeacher, whose deletion would then hang); a
changed or added one is judged as on CREATE.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError

from distillery.api import GROUP, KIND, PLURAL, TEACHER_KIND, TEACHER_PLURAL
from distillery.api.base import ApiModel
from distillery.api.bounds import MAX_LOCATION, Name
from distillery.api.pod import EnvVar, LabelSelector, Volume
from distillery.api.shared_teacher import DistillationTeacherSpec
from distillery.api.spec import DistillationJobSpec

POLICIES_FILE = Path(__file__).resolve().parents[1] / "charts" / "distillery" / "admission" / "policies.yaml"
"""Where the chart reads the CEL from (`.Files.Get`); the chart's template adds the settings variables."""

MAX_ALLOWED = 64
ValidationAction = Literal["Deny", "Warn", "Audit"]
DENY: ValidationAction = "Deny"
ImagePrefix = Annotated[str, Field(min_length=1, max_length=MAX_LOCATION)]


class AdmissionSettings(ApiModel):
    """The chart's `admission` values: what the policy allows (an empty list allows any)."""

    enabled: bool = False
    """Install the ValidatingAdmissionPolicies and their bindings (Kubernetes 1.30 or later)."""
    allowed_image_prefixes: list[ImagePrefix] = Field(default_factory=list, max_length=MAX_ALLOWED)
    """Image references a job or DistillationTeacher may name start with one of these (end a registry or
    repository prefix with '/': `ghcr.io/distillery-ai` would also allow `ghcr.io/distillery-ai-fork/...`)."""
    allowed_service_accounts: list[Name] = Field(default_factory=list, max_length=MAX_ALLOWED)
    """ServiceAccounts a job may name in `spec.serviceAccountName` (unset always passes: the operator then
    makes the job its own, allowed only to write that job's status)."""
    allow_secret_volumes: bool = True
    """false: no pod section of a job or DistillationTeacher may mount a `secret` volume."""
    allow_secret_env: bool = True
    """false: no pod section of a job or DistillationTeacher may take a variable from a Secret
    (`env[].valueFrom.secretKeyRef`); with `allowSecretVolumes: false`, a job's author reads no Secret of the
    namespace through the job."""
    validation_actions: list[ValidationAction] = Field(
        default_factory=lambda: [DENY], min_length=1, max_length=3
    )
    """What the API server does with a refusal: Deny, or Warn and/or Audit (to try a policy first)."""
    namespace_selector: LabelSelector | None = None
    """The namespaces the policy applies to (unset or empty: every one); `violations` cannot see a
    namespace's labels and judges every job as if its namespace were selected."""


def load_settings(path: str | Path) -> AdmissionSettings:
    """The `admission` section of a chart values file (the one the platform installed the chart with)."""
    values = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: not a chart values file (a mapping)")
    try:
        return AdmissionSettings.model_validate(values.get("admission") or {})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(["admission", *(str(part) for part in first["loc"])])
        raise ValueError(f"{path}: {where}: {first['msg']}") from None


# ---------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    """A refusal's words: `text` with `{placeholders}`, each a CEL expression in `cel` for the server."""

    text: str
    cel: dict[str, str]

    def format(self, **values: str) -> str:
        return self.text.format(**values)

    def expression(self) -> str:
        """The CEL messageExpression: the literal parts as CEL strings, the placeholders as expressions."""
        parts: list[str] = []
        rest = self.text
        while "{" in rest:
            literal, rest = rest.split("{", 1)
            name, rest = rest.split("}", 1)
            if literal:
                parts.append(_cel_string(literal))
            parts.append(self.cel[name])
        if rest:
            parts.append(_cel_string(rest))
        return " + ".join(parts)


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_literal(value: list[str] | bool) -> str:
    """A settings value as a CEL literal, spelt as the chart's `toJson` spells it (Go's encoder)."""
    text = json.dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


IMAGE = Message(
    "spec.image: {image} is not under an image prefix this cluster allows ({allowed}; the distillery chart's "
    "admission.allowedImagePrefixes)",
    {"image": "variables.image", "allowed": "variables.allowedImagePrefixes.join(', ')"},
)
SERVICE_ACCOUNT = Message(
    "spec.serviceAccountName: {name} is not a ServiceAccount this cluster allows ({allowed}; the distillery "
    "chart's admission.allowedServiceAccounts); unset, the job runs as its own, made by the operator",
    {"name": "variables.serviceAccount", "allowed": "variables.allowedServiceAccounts.join(', ')"},
)
SECRET_VOLUMES = Message(
    "{paths}: this cluster allows no Secret volumes (the distillery chart's admission.allowSecretVolumes is "
    "false); ask the platform team, or read the Secret another way",
    {"paths": "variables.secretVolumes.filter(p, !(p in variables.oldSecretVolumes)).join(', ')"},
)
SECRET_ENV = Message(
    "{paths}: this cluster allows no variables from Secrets (the distillery chart's admission.allowSecretEnv "
    "is false); ask the platform team",
    {"paths": "variables.secretEnv.filter(p, !(p in variables.oldSecretEnv)).join(', ')"},
)


# ---------------------------------------------------------------------------------------------- python


@dataclass(frozen=True)
class Violation:
    """One choice the settings refuse: the field path and the whole one-line message (it names the field)."""

    field: str
    message: str


def _pod_sections(spec: DistillationJobSpec | DistillationTeacherSpec) -> list[tuple[str, Any]]:
    """Every pod section of a job or DistillationTeacher, with its path as the policy names it."""
    if isinstance(spec, DistillationTeacherSpec):
        return [("spec.pool", spec.pool)]
    return [
        ("spec.student.pool", spec.student.pool),
        ("spec.student.head", spec.student.head),
        *((f"spec.teachers[name={t.name}].pool", t.pool) for t in spec.teachers),
    ]


def _is_secret_volume(volume: Volume) -> bool:
    return volume.secret is not None


def _is_secret_env(variable: EnvVar) -> bool:
    return variable.value_from is not None and variable.value_from.secret_key_ref is not None


def secret_volumes(spec: DistillationJobSpec | DistillationTeacherSpec) -> list[str]:
    """The Secret volumes of every pod section, as the policy names them."""
    return [
        f"{path}.volumes[name={v.name}]"
        for path, section in _pod_sections(spec)
        for v in section.volumes or []
        if _is_secret_volume(v)
    ]


def secret_env(spec: DistillationJobSpec | DistillationTeacherSpec) -> list[str]:
    """The variables taken from Secrets in every pod section, as the policy names them."""
    return [
        f"{path}.env[name={e.name}]"
        for path, section in _pod_sections(spec)
        for e in section.env or []
        if _is_secret_env(e)
    ]


def _image_violations(image: str, settings: AdmissionSettings) -> list[Violation]:
    prefixes = settings.allowed_image_prefixes
    if not prefixes or image.startswith(tuple(prefixes)):
        return []
    return [Violation("spec.image", IMAGE.format(image=image, allowed=", ".join(prefixes)))]


def _secret_violations(paths: list[str], allowed: bool, message: Message) -> list[Violation]:
    if allowed or not paths:
        return []
    return [Violation(paths[0], message.format(paths=", ".join(paths)))]


def violations(
    spec: DistillationJobSpec | DistillationTeacherSpec, settings: AdmissionSettings
) -> list[Violation]:
    """What the chart's policy refuses in a new job or DistillationTeacher with these settings."""
    found = _image_violations(spec.image, settings)
    if isinstance(spec, DistillationJobSpec):
        account, allowed = spec.service_account_name, settings.allowed_service_accounts
        if account is not None and allowed and account not in allowed:
            found.append(
                Violation(
                    "spec.serviceAccountName",
                    SERVICE_ACCOUNT.format(name=account, allowed=", ".join(allowed)),
                )
            )
    found += _secret_violations(secret_volumes(spec), settings.allow_secret_volumes, SECRET_VOLUMES)
    return found + _secret_violations(secret_env(spec), settings.allow_secret_env, SECRET_ENV)


# ---------------------------------------------------------------------------------------------- CEL


def _cel_secret_refs(obj: str, kind: str, field: str) -> str:
    """`obj`'s (`object` or `oldObject`) Secret volumes (`field` "volumes") or variables from Secrets ("env"),
    as `secret_volumes` and `secret_env` name them; [] for none."""
    chosen = {
        "volumes": "has(v.secret)",
        "env": "has(v.valueFrom) && has(v.valueFrom.secretKeyRef)",
    }[field]

    def section(sel: str, path: str) -> str:
        # `path` is a CEL string expression; every level is optional in the stored object.
        return f"(has({sel}.{field}) ? {sel}.{field}.filter(v, {chosen}).map(v, {path} + v.name + ']') : [])"

    if kind == TEACHER_KIND:
        pool = section(f"{obj}.spec.pool", _cel_string(f"spec.pool.{field}[name="))
        return f"(has({obj}.spec.pool) ? {pool} : [])"
    student = f"{obj}.spec.student"
    pool = section(f"{student}.pool", _cel_string(f"spec.student.pool.{field}[name="))
    head = section(f"{student}.head", _cel_string(f"spec.student.head.{field}[name="))
    teacher = section("t.pool", f"'spec.teachers[name=' + t.name + '].pool.{field}[name='")
    return (
        f"(has({student}.pool) ? {pool} : [])"
        f" + (has({student}.head) ? {head} : [])"
        f" + {obj}.spec.teachers.map(t, has(t.pool) ? {teacher} : []).flatten()"
    )


def _old_or_empty(kind: str, field: str) -> str:
    return f"oldObject == null ? [] : {_cel_secret_refs('oldObject', kind, field)}"


def _image(obj: str, default: str) -> str:
    return f"has({obj}.spec.image) ? {obj}.spec.image : {_cel_string(default)}"


SETTINGS_VARIABLES = (
    "allowedImagePrefixes",
    "allowedServiceAccounts",
    "allowSecretVolumes",
    "allowSecretEnv",
)
"""The variables the chart's template fills from its values, before the policy's own."""


@dataclass(frozen=True)
class Validation:
    """One CEL validation of a policy and the Python check it twins (`violations` runs them all)."""

    expression: str
    message: Message

    def as_yaml(self) -> dict[str, str]:
        return {
            "expression": self.expression,
            "messageExpression": self.message.expression(),
            "reason": "Forbidden",
        }


@dataclass(frozen=True)
class Policy:
    """The ValidatingAdmissionPolicy of one kind: the resource it matches, its variables and validations."""

    kind: str
    resource: str
    variables: tuple[tuple[str, str], ...]
    validations: tuple[Validation, ...]

    def as_yaml(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "variables": [{"name": n, "expression": e} for n, e in self.variables],
            "validations": [v.as_yaml() for v in self.validations],
        }


_JOB_IMAGE_DEFAULT = str(DistillationJobSpec.model_fields["image"].default)
_TEACHER_IMAGE_DEFAULT = str(DistillationTeacherSpec.model_fields["image"].default)

_IMAGE_VALIDATION = Validation(
    "variables.allowedImagePrefixes.size() == 0 || variables.imageUnchanged"
    " || variables.allowedImagePrefixes.exists(p, variables.image.startsWith(p))",
    IMAGE,
)
_SECRET_VALIDATIONS = (
    Validation(
        "variables.allowSecretVolumes || variables.secretVolumes.all(p, p in variables.oldSecretVolumes)",
        SECRET_VOLUMES,
    ),
    Validation(
        "variables.allowSecretEnv || variables.secretEnv.all(p, p in variables.oldSecretEnv)", SECRET_ENV
    ),
)


def _secret_variables(kind: str) -> tuple[tuple[str, str], ...]:
    return (
        ("secretVolumes", _cel_secret_refs("object", kind, "volumes")),
        ("oldSecretVolumes", _old_or_empty(kind, "volumes")),
        ("secretEnv", _cel_secret_refs("object", kind, "env")),
        ("oldSecretEnv", _old_or_empty(kind, "env")),
    )


def _image_variables(default: str) -> tuple[tuple[str, str], ...]:
    return (
        ("image", _image("object", default)),
        ("imageUnchanged", f"oldObject != null && variables.image == ({_image('oldObject', default)})"),
    )


POLICIES: dict[str, Policy] = {
    KIND: Policy(
        KIND,
        PLURAL,
        (
            *_image_variables(_JOB_IMAGE_DEFAULT),
            (
                "serviceAccount",
                "has(object.spec.serviceAccountName) ? object.spec.serviceAccountName : ''",
            ),
            (
                "serviceAccountUnchanged",
                "oldObject != null && has(oldObject.spec.serviceAccountName)"
                " && oldObject.spec.serviceAccountName == variables.serviceAccount",
            ),
            *_secret_variables(KIND),
        ),
        (
            _IMAGE_VALIDATION,
            Validation(
                "variables.serviceAccount == '' || variables.allowedServiceAccounts.size() == 0"
                " || variables.serviceAccountUnchanged || variables.serviceAccount in variables.allowedServiceAccounts",
                SERVICE_ACCOUNT,
            ),
            *_SECRET_VALIDATIONS,
        ),
    ),
    TEACHER_KIND: Policy(
        TEACHER_KIND,
        TEACHER_PLURAL,
        (
            *_image_variables(_TEACHER_IMAGE_DEFAULT),
            *_secret_variables(TEACHER_KIND),
        ),
        (_IMAGE_VALIDATION, *_SECRET_VALIDATIONS),
    ),
}


def settings_variables(settings: AdmissionSettings) -> list[dict[str, str]]:
    """The variables the chart renders from its values (what its template spells with `toJson`)."""
    values: dict[str, list[str] | bool] = {
        "allowedImagePrefixes": list(settings.allowed_image_prefixes),
        "allowedServiceAccounts": list(settings.allowed_service_accounts),
        "allowSecretVolumes": settings.allow_secret_volumes,
        "allowSecretEnv": settings.allow_secret_env,
    }
    return [{"name": name, "expression": cel_literal(values[name])} for name in SETTINGS_VARIABLES]


def policy_spec(kind: str, settings: AdmissionSettings) -> dict[str, Any]:
    """The `spec` of the ValidatingAdmissionPolicy the chart renders for `kind` with these settings."""
    policy = POLICIES[kind]
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [GROUP],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [policy.resource],
                }
            ]
        },
        "variables": settings_variables(settings) + policy.as_yaml()["variables"],
        "validations": policy.as_yaml()["validations"],
    }


def policies_file() -> str:
    """The text of `POLICIES_FILE`."""
    header = (
        "# Generated from distillery/admission.py by `python -m distillery.admission`: edit that, not this.\n"
        "# templates/admission-policy.yaml renders one ValidatingAdmissionPolicy per kind from it.\n"
    )
    body = {kind: policy.as_yaml() for kind, policy in POLICIES.items()}
    return header + yaml.safe_dump(body, sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    """Writes `POLICIES_FILE` (no arguments) or prints it (`-`)."""
    if argv == ["-"]:
        sys.stdout.write(policies_file())
        return 0
    POLICIES_FILE.parent.mkdir(exist_ok=True)
    POLICIES_FILE.write_text(policies_file())
    print(f"wrote {POLICIES_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
