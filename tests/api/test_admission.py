"""`distillery validate --admission`: the chart's admission settings judged before a manifest is applied.

The same check as the API server's (tests/cluster/test_admission_on_server.py compares the two lines).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from distillery_cli.main import main

from distillery.admission import AdmissionSettings, load_settings, violations
from distillery.validation import load_jobs, load_teacher, parse_job, parse_teacher

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "standalone-teacher.yaml"
TEACHER = ROOT / "examples" / "teachers" / "qwen-7b.yaml"
SECRET = {"name": "creds", "secret": {"secretName": "creds"}}


def settings(**values: object) -> AdmissionSettings:
    return AdmissionSettings.model_validate({"enabled": True, **values})


def test_defaults_and_empty_lists_allow_anything() -> None:
    (job,) = load_jobs(JOB)
    spec = job.spec.model_copy(update={"image": "docker.io/anyone/x:1", "service_account_name": "default"})
    assert violations(spec, AdmissionSettings()) == []
    assert violations(spec, settings(allowedImagePrefixes=[], allowedServiceAccounts=[])) == []


def test_each_refusal_names_its_field() -> None:
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"].update(image="docker.io/me/x:1", serviceAccountName="default")
    doc["spec"]["student"]["pool"]["volumes"] = [SECRET, {"name": "tmp", "emptyDir": {}}]
    doc["spec"]["teachers"][0]["pool"] = {"volumes": [SECRET]}
    found = violations(
        parse_job(doc).spec,
        settings(
            allowedImagePrefixes=["ghcr.io/distillery-ai/"],
            allowedServiceAccounts=["distillery-runtime"],
            allowSecretVolumes=False,
        ),
    )
    assert [v.field for v in found] == [
        "spec.image",
        "spec.serviceAccountName",
        "spec.student.pool.volumes[name=creds]",
    ]
    assert found[0].message.startswith("spec.image: docker.io/me/x:1 is not under an image prefix")
    assert "(ghcr.io/distillery-ai/;" in found[0].message
    assert found[2].message.startswith(
        "spec.student.pool.volumes[name=creds], spec.teachers[name=qwen-7b].pool.volumes[name=creds]: "
        "this cluster allows no Secret volumes"
    )
    assert all("\n" not in v.message for v in found)


SECRET_VARIABLE = {
    "name": "TOKEN",
    "valueFrom": {"secretKeyRef": {"name": "other-job-teacher-key", "key": "api-key"}},
}


def test_variables_from_secrets_are_refused_when_not_allowed() -> None:
    """A Secret read into a variable is a Secret read all the same (another job's teacher key, say)."""
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["student"]["head"] = {"env": [{"name": "PLAIN", "value": "1"}, SECRET_VARIABLE]}
    doc["spec"]["teachers"][0]["pool"] = {"env": [SECRET_VARIABLE]}
    spec = parse_job(doc).spec
    assert violations(spec, settings(allowSecretVolumes=False)) == []  # variables are their own setting
    (refused,) = violations(spec, settings(allowSecretEnv=False))
    assert refused.field == "spec.student.head.env[name=TOKEN]"
    assert refused.message == (
        "spec.student.head.env[name=TOKEN], spec.teachers[name=qwen-7b].pool.env[name=TOKEN]: this cluster "
        "allows no variables from Secrets (the distillery chart's admission.allowSecretEnv is false); ask the "
        "platform team"
    )
    teacher = yaml.safe_load(TEACHER.read_text())
    teacher["spec"]["pool"]["env"] = [SECRET_VARIABLE]
    (refused,) = violations(parse_teacher(teacher).spec, settings(allowSecretEnv=False))
    assert refused.field == "spec.pool.env[name=TOKEN]"


def test_a_teachers_image_and_volumes() -> None:
    spec = load_teacher(TEACHER).spec
    assert violations(spec, settings(allowedImagePrefixes=["ghcr.io/distillery-ai/"])) == []
    (refused,) = violations(spec, settings(allowedImagePrefixes=["registry.example.com/"]))
    assert refused.field == "spec.image"


def test_validate_reads_the_charts_values_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"admission": {"enabled": True, "allowedImagePrefixes": ["corp.io/"]}}))
    assert main(["validate", str(JOB), str(TEACHER), "--admission", str(values)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{JOB}: spec.image: ghcr.io/distillery-ai/distillery-runtime:0.1.0 is not under an image prefix this "
        "cluster allows (corp.io/; the distillery chart's admission.allowedImagePrefixes)",
        f"{TEACHER}: spec.image: ghcr.io/distillery-ai/distillery-runtime:0.1.0 is not under an image prefix "
        "this cluster allows (corp.io/; the distillery chart's admission.allowedImagePrefixes)",
    ]
    # The chart's own defaults allow everything.
    assert main(["validate", "-q", str(JOB), "--admission", str(ROOT / "charts/distillery/values.yaml")]) == 0


def test_a_misspelt_values_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("admission: {allowSecretVolume: false}\n")
    with pytest.raises(ValueError, match=r"admission\.allowSecretVolume: Extra inputs are not permitted"):
        load_settings(values)
    assert main(["validate", str(JOB), "--admission", str(values)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
