"""Where a job's checkpoints, metrics and final model live in a cluster (distillery/plan/checkpoints/storage.py):
the user's claim, the operator's claim (its name, size, access mode, class and life), or an emptyDir, and
`distillery plan` saying which and why."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from distillery_cli.main import main as cli_main

from distillery.api.spec import DistillationJobSpec
from distillery.model_shapes import known_shape
from distillery.plan.checkpoints.storage import (
    FALLBACK_SIZE,
    GIB,
    READ_WRITE_MANY,
    CheckpointStorage,
    checkpoint_claim_name,
    checkpoint_storage,
)
from distillery.validation import parse_job


def _spec(
    base: dict[str, Any], *, student: str = "Qwen/Qwen2.5-0.5B", workers: int = 1, **checkpoint: Any
) -> DistillationJobSpec:
    doc = copy.deepcopy(base)
    doc["spec"]["student"].update(model=student, pool={"workers": workers, "gpusPerWorker": 1})
    doc["spec"]["checkpoint"] = checkpoint
    return parse_job(doc).spec


def test_a_job_that_names_no_claim_gets_the_operators_claim_kept_after_it(
    base_manifest: dict[str, Any],
) -> None:
    storage = checkpoint_storage("distill", _spec(base_manifest))
    assert storage.claim == "distill-checkpoints" == checkpoint_claim_name("distill")
    claim = storage.operator_claim
    assert claim is not None and not claim.delete_with_job and claim.storage_class_name is None
    assert storage.kept and not storage.ephemeral
    # The head and the worker are two pods, which may be scheduled on two nodes.
    assert claim.access_mode == READ_WRITE_MANY


def test_the_size_follows_the_students_parameters_keep_and_dtype(base_manifest: dict[str, Any]) -> None:
    """1.1 x P x ((keep + 1) x (12 + d) + d) + 1 GiB, rounded up: keep + 1 checkpoints exist while a save
    prunes the oldest, and final/ may be a copy of the model."""
    shape = known_shape("Qwen/Qwen2.5-1.5B")
    assert shape is not None
    for keep, dtype, d in ((3, "bfloat16", 2), (1, "float32", 4), (10, "float16", 2)):
        spec = _spec(base_manifest, student="Qwen/Qwen2.5-1.5B", keep=keep, modelDtype=dtype)
        claim = checkpoint_storage("j", spec).operator_claim
        assert claim is not None
        expected = math.ceil((1.1 * shape.params * ((keep + 1) * (12 + d) + d) + GIB) / GIB)
        assert claim.size == f"{expected}Gi", (keep, dtype)
    spec = _spec(base_manifest, student="Qwen/Qwen2.5-1.5B")
    assert checkpoint_storage("j", spec).operator_claim.size == "93Gi"  # type: ignore[union-attr]
    # Larger students, more room: a 7B's four checkpoints and AdamW state.
    big = checkpoint_storage("j", _spec(base_manifest, student="Qwen/Qwen2.5-7B")).operator_claim
    assert big is not None and int(big.size.removesuffix("Gi")) > 400


def test_the_size_of_a_local_student_comes_from_its_config(
    base_manifest: dict[str, Any], tmp_path: Path
) -> None:
    config = {
        "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000,
        "num_attention_heads": 4, "model_type": "llama",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    claim = checkpoint_storage("j", _spec(base_manifest, student=str(tmp_path))).operator_claim
    assert claim is not None and claim.size == "2Gi"  # tiny: the 1 GiB for the run's files, rounded up
    assert "auto: 0.00B parameters" in claim.size_reason


def test_a_size_set_in_the_spec_is_used_and_an_unknown_student_gets_the_fallback(
    base_manifest: dict[str, Any],
) -> None:
    claim = checkpoint_storage("j", _spec(base_manifest, size="1.5Ti")).operator_claim
    assert claim is not None and (claim.size, claim.size_reason) == ("1.5Ti", "set in the spec")
    unknown = checkpoint_storage("j", _spec(base_manifest, student="my-org/my-model")).operator_claim
    assert unknown is not None and unknown.size == FALLBACK_SIZE == "100Gi"
    assert "shape is unknown" in unknown.size_reason


def test_class_and_life_are_the_specs(base_manifest: dict[str, Any]) -> None:
    spec = _spec(base_manifest, storageClassName="nfs-rwx", deleteWithJob=True)
    storage = checkpoint_storage("j", spec)
    assert storage.operator_claim is not None and storage.operator_claim.storage_class_name == "nfs-rwx"
    assert storage.claim == "j-checkpoints" and not storage.kept  # owned by the job, deleted with it


def test_a_users_claim_is_mounted_as_it_is_and_ephemeral_has_none(base_manifest: dict[str, Any]) -> None:
    mine = checkpoint_storage("j", _spec(base_manifest, pvc="my-claim"))
    assert (mine.claim, mine.operator_claim, mine.kept) == ("my-claim", None, True)
    gone = checkpoint_storage("j", _spec(base_manifest, ephemeral=True))
    assert gone == CheckpointStorage(path="/checkpoints", claim=None) and gone.ephemeral and not gone.kept


def test_the_claim_name_is_a_dns_label_and_the_same_for_every_job_of_a_name() -> None:
    long = "a" * 200 + ".b"
    name = checkpoint_claim_name(long)
    assert len(name) <= 63 and name == checkpoint_claim_name(long)
    assert name != checkpoint_claim_name("a" * 200 + ".c")


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [
        ({}, "checkpoint storage: claim base-checkpoints at /checkpoints, made by the operator, kept after"),
        ({"deleteWithJob": True}, "made by the operator, deleted with the job (checkpoint.deleteWithJob)"),
        ({"pvc": "mine"}, "checkpoint storage: claim mine at /checkpoints (checkpoint.pvc: yours"),
        ({"ephemeral": True}, "checkpoint storage: emptyDir at /checkpoints (checkpoint.ephemeral): lost"),
    ],
)
def test_distillery_plan_prints_the_storage_decision(
    tmp_path: Path,
    base_manifest: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    checkpoint: dict[str, Any],
    expected: str,
) -> None:
    doc = copy.deepcopy(base_manifest)
    doc["spec"]["checkpoint"] = checkpoint
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli_main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert expected in out
    if not checkpoint:
        assert "    size: 31Gi (auto: 0.49B parameters x (4 checkpoints x 14 + final/ 2) bytes" in out
        assert "    accessModes: ReadWriteMany (2 pods mount it, the Ray head and 1 worker" in out
        assert "    storageClassName: the cluster's default" in out


def test_the_runtime_config_names_the_claim_in_a_cluster_only(base_manifest: dict[str, Any]) -> None:
    """The runtime names the claim in status.model; a local run writes to its output folder, on no claim."""
    from distillery.runtime_config import resolve_runtime_config

    job = parse_job(base_manifest)
    assert resolve_runtime_config(job, "ns", in_cluster=True).checkpoint_claim == "base-checkpoints"
    assert resolve_runtime_config(job, None, in_cluster=False).checkpoint_claim is None


def test_a_lora_students_claim_holds_the_merged_model_and_the_adapter_not_its_float32_state(
    base_manifest: dict[str, Any],
) -> None:
    """A LoRA checkpoint: the merged model in modelDtype (d) and the adapter's float32 weights and AdamW
    moments (12 bytes for each of its T parameters), no float32 copy of the base: 1.1 x ((keep + 1) x
    (P x d + T x 12) + P x d + T x 4) + 1 GiB."""
    from distillery.plan.lora import adapter_params, resolve_lora

    doc = copy.deepcopy(base_manifest)
    doc["spec"]["student"].update(model="Qwen/Qwen2.5-1.5B", lora={"rank": 16})
    doc["spec"]["checkpoint"] = {"keep": 3}
    spec = parse_job(doc).spec
    shape, lora = known_shape("Qwen/Qwen2.5-1.5B"), resolve_lora(spec)
    assert shape is not None and lora is not None
    adapter = adapter_params(shape, lora)
    assert 0 < adapter < shape.params / 50  # rank 16 on every linear layer: about 1% of the model
    claim = checkpoint_storage("j", spec).operator_claim
    assert claim is not None
    p = shape.params
    expected = math.ceil((1.1 * (4 * (p * 2 + adapter * 12) + p * 2 + adapter * 4) + GIB) / GIB)
    assert claim.size == f"{expected}Gi" == "18Gi"  # full fine-tuning's: 93Gi
    assert "LoRA" in claim.size_reason and f"{adapter / 1e6:.2f}M parameters x 12 bytes" in claim.size_reason
