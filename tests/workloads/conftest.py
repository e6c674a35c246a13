"""Fixtures of the scenarios that run a DistillationJob's pods on a real node.

Session: the CPU images built from docker/*.Dockerfile (once, tests/support/images.py), a one-node
cluster (tests/support/node_cluster.py: control plane, node, CoreDNS, KubeRay's operator), the images
imported into the node, and the chart installed as a platform team installs it: its CRDs, its RBAC and
its operator Deployment, whose pod runs the operator image with in-cluster config. Per test: a
namespace with Pod Security `restricted` enforced, a ResourceQuota on cpu, memory and GPUs and a
LimitRange (`node_jobs.production_namespace`), and hostPath PersistentVolumes bound to the job's claims (no storage provisioner runs here)
holding tiny models and data built on this machine.

Without root, the host packages or the node scripts these tests skip with the reason; with `CI=true`
that fails the run instead.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from control_plane import MissingAssets, assets_dir
from harness import RELEASE_NAMESPACE, Installation, install, temporary_namespace, wait_until
from images import BuiltImage, build_images, start_build
from node_cluster import MissingNodeTools, NodeCluster, node_tools
from node_jobs import Workspace, deployment_available, production_namespace

# The images' archives and the stamp of their sources (tests/support/images.py): in the clone, or where
# `$DISTILLERY_IMAGES_DIR` says, which a CI machine keeps between runs (.ci/run): a run whose image sources
# are those of the last build on the machine imports its images instead of building them again; a change
# to any of them builds anew, from the dependency layers buildah keeps there (about 2 minutes of the two
# cores instead of 10-20).
IMAGES_DIR = Path(
    os.environ.get("DISTILLERY_IMAGES_DIR") or Path(__file__).resolve().parents[2] / ".k8s-assets" / "images"
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the images' build as soon as the session knows it will run a scenario here that needs them,
    so the tests before them hide it (tests/support/images.py). (The NetworkPolicy test needs the node
    alone: its pods run the node's busybox.)"""
    here = Path(__file__).parent
    scenarios = [item for item in session.items if "images" in getattr(item, "fixturenames", ())]
    if session.config.option.collectonly or not any(here in item.path.parents for item in scenarios):
        return
    try:
        node_tools()
    except MissingNodeTools:
        return  # the node_cluster fixture reports it, and nothing will need the images
    start_build(IMAGES_DIR)


def _required(error: Exception) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI runs the workload scenarios on a real node: {error}", pytrace=False)
    pytest.skip(f"no real node: {error}")


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    try:
        tools, assets = node_tools(), assets_dir()
    except (MissingNodeTools, MissingAssets) as error:
        _required(error)
    cluster = NodeCluster(tools, tmp_path_factory.mktemp("node"), assets, assets / "kuberay-crds").start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def enforcing_node(node_cluster: NodeCluster) -> Iterator[NodeCluster]:
    """The node with NetworkPolicies enforced (kube-network-policies, `netpol.sh` from the tools folder that
    `DISTILLERY_K8S_NODE_TOOLS` names) for one module's tests; stopped after them, so that the other
    scenarios' node is as it was (fail-open)."""
    try:
        node_cluster.start_netpol()
    except MissingNodeTools as error:
        _required(error)
    try:
        yield node_cluster
    finally:
        node_cluster.stop_netpol()


@pytest.fixture(scope="session")
def images(node_cluster: NodeCluster) -> list[BuiltImage]:
    built = build_images(IMAGES_DIR)
    for image in built:
        node_cluster.import_image(image.archive)
    return built


@pytest.fixture(scope="session")
def installation(
    node_cluster: NodeCluster, images: list[BuiltImage], tmp_path_factory: pytest.TempPathFactory
) -> Installation:
    """The chart as `helm install` leaves it: the operator runs in its Deployment's pod."""
    # Shared teachers decided every 2 s (the chart's default is 15): the scenario's jobs last a minute.
    values = {"sharedTeachers": {"scalingIntervalSeconds": 2}}
    installed = install(node_cluster, tmp_path_factory.mktemp("installation"), values)  # type: ignore[arg-type]
    wait_until(
        lambda: deployment_available(installed, RELEASE_NAMESPACE),
        timeout=120,
        what="the operator Deployment to be available",
    )
    return installed


@pytest.fixture
def namespace(installation: Installation) -> Iterator[str]:
    """A namespace as a platform team gives one (Pod Security restricted, quota, limits)."""
    with temporary_namespace(installation, "w") as name:
        production_namespace(installation, name)
        yield name


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny student and teacher sharing one tokenizer, and addition prompts, in one folder (the
    contents of the `models` claim)."""
    import torch
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    root = tmp_path_factory.mktemp("models")
    texts = [f"{a}+{b}={a + b}" for a in range(100) for b in range(0, 100, 7)]
    # A base model's tokenizer (its alphabet cannot spell a template's roles): prompts are raw text.
    tok = build_tokenizer(texts, 64, full_byte_alphabet=False, chat_template=None)
    save_tiny_model(
        root / "student", tokenizer=tok, hidden=128, layers=1, heads=2, seed=1, dtype=torch.float32
    )
    save_tiny_model(
        root / "teacher", tokenizer=tok, hidden=128, layers=2, heads=2, seed=2, dtype=torch.float32
    )
    rng = random.Random(0)
    with open(root / "train.jsonl", "w") as handle:
        for _ in range(64):
            a, b = rng.randrange(100), rng.randrange(100)
            source = "add" if a % 2 else "sub"
            handle.write(
                json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": source}) + "\n"
            )
    return root


@pytest.fixture
def workspace(
    installation: Installation, namespace: str, model_files: Path, tmp_path: Path
) -> Iterator[Workspace]:
    space = Workspace.create(installation, namespace, model_files, tmp_path)
    try:
        yield space
    finally:
        space.close()
