"""The model cache (distillery/plan/pods/model_cache.py) as rendered: HF_HOME on a volume in every pod that
downloads a model, sized and requested as ephemeral storage, or the user's claim; none where nothing is
downloaded."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from distillery_operator.render import RenderContext, render_job

from distillery.plan.pods.model_cache import HF_HOME, VOLUME_NAME, downloads, model_cache
from distillery.validation import parse_job

ROOT = Path(__file__).resolve().parents[2]
STANDALONE = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())


def pods(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each pod template of the job, by kind: teacher, head, worker, submitter."""
    objects = render_job(parse_job(doc), RenderContext(namespace="ns"))
    out = {}
    for obj in objects:
        if obj["kind"] == "Deployment":
            out["teacher"] = obj["spec"]["template"]["spec"]
        if obj["kind"] == "RayJob":
            cluster = obj["spec"]["rayClusterSpec"]
            out["head"] = cluster["headGroupSpec"]["template"]["spec"]
            out["worker"] = cluster["workerGroupSpecs"][0]["template"]["spec"]
            out["submitter"] = obj["spec"]["submitterPodTemplate"]["spec"]
    return out


def cache_of(pod: dict[str, Any]) -> tuple[dict[str, Any] | None, bool, dict[str, str]]:
    """(the cache volume, mounted at HF_HOME with HF_HOME set, the container's requests)."""
    (container,) = pod["containers"]
    volume = next((v for v in pod.get("volumes", []) if v["name"] == VOLUME_NAME), None)
    mounted = {"name": VOLUME_NAME, "mountPath": HF_HOME} in container.get("volumeMounts", [])
    env = {"name": "HF_HOME", "value": HF_HOME} in container.get("env", [])
    return volume, mounted and env, container["resources"]["requests"]


def test_pods_that_download_get_a_sized_emptydir_requested_as_ephemeral_storage() -> None:
    rendered = pods(copy.deepcopy(STANDALONE))
    for kind, size in (("teacher", "17Gi"), ("head", "5Gi"), ("worker", "5Gi")):
        volume, mounted, requests = cache_of(rendered[kind])
        assert volume == {"name": VOLUME_NAME, "emptyDir": {"sizeLimit": size}}, kind
        assert mounted and requests["ephemeral-storage"] == size, kind
    assert cache_of(rendered["submitter"])[0] is None  # it downloads nothing


def test_the_users_claim_is_every_pods_cache_and_a_size_is_the_users() -> None:
    doc = copy.deepcopy(STANDALONE)
    doc["spec"]["modelCache"] = {"pvc": "hf-cache"}
    for kind in ("teacher", "head", "worker"):
        volume, mounted, requests = cache_of(pods(doc)[kind])
        assert volume == {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": "hf-cache"}}
        assert mounted and "ephemeral-storage" not in requests
    doc["spec"]["modelCache"] = {"sizeLimit": "300Gi"}
    volume, _, requests = cache_of(pods(doc)["teacher"])
    assert volume == {"name": VOLUME_NAME, "emptyDir": {"sizeLimit": "300Gi"}}
    assert requests["ephemeral-storage"] == "300Gi"


def test_no_cache_where_nothing_is_downloaded_or_it_is_off() -> None:
    doc = copy.deepcopy(STANDALONE)
    doc["spec"]["student"]["model"] = "pvc://models/student"
    doc["spec"]["teachers"][0]["model"] = "pvc://models/teacher"
    assert model_cache(parse_job(doc).spec) == {}
    assert all(cache_of(pod)[0] is None for pod in pods(doc).values())
    doc = copy.deepcopy(STANDALONE)
    doc["spec"]["modelCache"] = {"enabled": False}
    assert all(cache_of(pod)[0] is None for pod in pods(doc).values())


def test_a_size_the_user_gives_is_a_cache_in_every_pod_even_one_that_downloads_nothing() -> None:
    doc = copy.deepcopy(STANDALONE)
    doc["spec"]["teachers"][0]["model"] = "pvc://models/teacher"
    doc["spec"]["modelCache"] = {"sizeLimit": "2Gi"}
    rendered = pods(doc)
    for kind in ("teacher", "head", "worker"):
        volume, mounted, requests = cache_of(rendered[kind])
        assert volume == {"name": VOLUME_NAME, "emptyDir": {"sizeLimit": "2Gi"}}, kind
        assert mounted and requests["ephemeral-storage"] == "2Gi", kind


def test_only_hub_ids_are_downloaded() -> None:
    assert downloads("Qwen/Qwen2.5-7B-Instruct") and downloads("gpt2")
    for location in ("pvc://models/x", "s3://bucket/x", "/models/x", "./x", None, "a/b/c"):
        assert not downloads(location), location
