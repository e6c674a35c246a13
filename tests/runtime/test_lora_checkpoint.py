"""A LoRA student's checkpoints (training/lora_export.py, checkpoint.py, workers.TrainerWorker save and
load): after real steps, adapter/ is what peft loads onto the base (the trainer's own log-probs), model/ is
the merged model that `from_pretrained` loads (peft's own merge, greedy generation of base + adapter), no
master/, trainer.pt holds the adapter's AdamW state alone, final/ publishes both; a resume onto the base
continues bit for bit, on one rank and on two FSDP2 ranks (gloo); the plan's and the preflight's sizes are
the merged model's and the adapter's, not 14 bytes a parameter.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from distillery_runtime.checkpoints import checkpoint
from distillery_runtime.run.workers import TrainerWorker

from distillery.api.spec import LossMode, ModelDtype, Precision, Sharding
from distillery.plan.checkpoints.export import ExportSettings
from distillery.plan.checkpoints.storage import checkpoint_bytes
from distillery.plan.lora import LoraSettings
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import train_steps

VOCAB = 64
SAVED_AT, STEPS = 2, 4
LORA = LoraSettings(rank=4, alpha=8, modules_to_save=("lm_head",))
SETTINGS = TrainerSettings(
    lr=1e-2, weight_decay=0.1, grad_clip=0.5, micro_batch_size=2, precision=Precision.FLOAT32,
    total_steps=STEPS, warmup_steps=1, loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK),
    sharding=Sharding.REPLICATE, streamed_export=True, lora=LORA,
)  # fmt: skip
PROMPT, RESPONSE = [5, 9, 13, 21], [7, 30, 2, 44, 18]


def _steps(worker: TrainerWorker, steps: range, rank: int = 0, world: int = 1) -> list[float]:
    return train_steps(worker, SETTINGS.loss, VOCAB, steps, rank, world)


def _adapter(worker: TrainerWorker) -> dict[str, torch.Tensor]:
    """The live adapter by peft's saved names (whole: a collective under FSDP2)."""
    return {name: tensor.clone() for name, tensor in worker.trainer.weights()}


def _export(model_dir: Path, dtype: ModelDtype = ModelDtype.BFLOAT16) -> ExportSettings:
    return ExportSettings(dtype=dtype, tokenizer=str(model_dir), base_model="hf://org/student")


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    tmp = tmp_path_factory.mktemp("lora")
    texts = [f"{a}+{b}={a + b}" for a in range(50) for b in range(0, 50, 7)]
    tok = build_tokenizer(texts, VOCAB, full_byte_alphabet=False)
    return save_tiny_model(
        tmp / "student", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32
    )


@pytest.fixture(scope="module")
def run(student: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A LoRA run of STEPS steps on one rank, checkpointed at SAVED_AT (bfloat16 model/) and at its last
    step (float32 model/, published as final/), and its resume from SAVED_AT."""
    torch.use_deterministic_algorithms(True)
    root = tmp_path_factory.mktemp("lora-run") / "ckpt"
    worker = TrainerWorker(str(student), SETTINGS, 0, 1)
    _steps(worker, range(SAVED_AT))
    saved, _ = worker.save_checkpoint(str(root), SAVED_AT, {"version": SAVED_AT}, 3, _export(student), False)
    at_save = {
        "adapter": _adapter(worker),
        "logprobs": worker.sequence_logprobs(PROMPT, RESPONSE),
        "optimizer": worker.trainer.optimizer.state_dict(),
        "merged": {n: t.clone() for n, t in worker.trainer.merged_state_dict().items()},
    }
    losses = _steps(worker, range(SAVED_AT, STEPS))
    last, final = worker.save_checkpoint(
        str(root), STEPS, {"version": STEPS}, 3, _export(student, ModelDtype.FLOAT32), True
    )
    # The same checkpoint written whole (save_pretrained of the merged state dict), not streamed.
    worker.trainer.settings = dataclasses.replace(SETTINGS, streamed_export=False)
    whole, _ = worker.save_checkpoint(
        f"{root}-whole", STEPS, {"version": STEPS}, 3, _export(student, ModelDtype.FLOAT32), False
    )
    ref = checkpoint.CheckpointRef(SAVED_AT, Path(saved))
    resumed = TrainerWorker(str(checkpoint.weights_dir(ref, base=student)), SETTINGS, 0, 1)
    version = resumed.load_state(saved)
    restored = {"adapter": _adapter(resumed), "optimizer": resumed.trainer.optimizer.state_dict()}
    yield {
        "student": student,
        "saved": Path(saved),
        "last": Path(last),
        "whole": Path(whole),
        "final": Path(final),
        "at_save": at_save,
        "losses": losses,
        "adapter": _adapter(worker),
        "logprobs": worker.sequence_logprobs(PROMPT, RESPONSE),
        "version": version,
        "restored": restored,
        "resumed_losses": _steps(resumed, range(SAVED_AT, STEPS)),
        "resumed_adapter": _adapter(resumed),
        "trainer": worker.trainer,
    }
    torch.use_deterministic_algorithms(False)


def _peft(student: Path, adapter: Path) -> Any:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter).eval()


@torch.no_grad()
def _logprobs(model: Any, prompt: list[int], response: list[int]) -> list[float]:
    logits = model(input_ids=torch.tensor([[*prompt, *response]])).logits.float()
    logp = torch.log_softmax(logits[0, len(prompt) - 1 : -1], -1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()  # type: ignore[no-any-return]


def test_a_checkpoint_holds_the_adapter_the_merged_model_and_the_adapters_optimizer(
    run: dict[str, Any],
) -> None:
    saved = run["saved"]
    assert sorted(p.name for p in saved.iterdir()) == sorted(
        ["adapter", "model", "trainer.pt", "state.json", "COMPLETE"]
    )  # no master/: the base is the job's own student model
    config = json.loads((saved / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "hf://org/student" and config["r"] == 4
    assert config["lora_alpha"] == 8.0 and config["modules_to_save"] == ["lm_head"]
    adapter = checkpoint.read_adapter(checkpoint.CheckpointRef(SAVED_AT, saved))
    at_save = run["at_save"]["adapter"]
    assert adapter.keys() == at_save.keys() and all(torch.equal(adapter[n], at_save[n]) for n in adapter)
    assert all(t.dtype == torch.float32 for t in adapter.values())
    # Trained: every B moved off peft's zeros.
    assert all(float(t.abs().max()) > 1e-3 for n, t in adapter.items() if ".lora_B." in n)
    model = json.loads((saved / "model" / "config.json").read_text())
    assert model["architectures"] == ["LlamaForCausalLM"] and model["dtype"] == "bfloat16"
    for name in ("tokenizer.json", "generation_config.json", "model.safetensors"):
        assert (saved / "model" / name).is_file(), name
    # AdamW state of the adapter's parameters alone: 2 x 7 x 2 LoRA matrices and lm_head trained whole.
    state = checkpoint.load_trainer_state(checkpoint.CheckpointRef(SAVED_AT, saved))
    moments = state["optimizer"]["state"]
    assert len(moments) == len(adapter) == 2 * 7 * 2 + 1
    assert sum(m["exp_avg"].numel() for m in moments.values()) == sum(t.numel() for t in adapter.values())


def test_peft_loads_the_adapter_onto_the_base_and_scores_as_the_trainer(run: dict[str, Any]) -> None:
    model = _peft(run["student"], run["saved"] / "adapter")
    got, want = _logprobs(model, PROMPT, RESPONSE), run["at_save"]["logprobs"]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5, (got, want)


def test_the_kept_model_is_the_merge_loaded_by_from_pretrained_and_generates_as_base_and_adapter(
    run: dict[str, Any],
) -> None:
    from transformers import AutoModelForCausalLM

    merged = _peft(run["student"], run["saved"] / "adapter").merge_and_unload().state_dict()
    # The trainer's merge is peft's own (float32, to its round-off), under the base's names.
    ours = run["at_save"]["merged"]
    assert ours.keys() == merged.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-6, msg=name)
    kept = AutoModelForCausalLM.from_pretrained(run["saved"] / "model")
    assert kept.dtype == torch.bfloat16
    for name, tensor in kept.state_dict().items():
        assert torch.equal(tensor, merged[name].to(torch.bfloat16)), name
    # The last checkpoint's float32 model/ generates greedily what base + adapter generate.
    last = AutoModelForCausalLM.from_pretrained(run["last"] / "model", dtype=torch.float32).eval()
    with_adapter = _peft(run["student"], run["last"] / "adapter")
    prompt = torch.tensor([PROMPT])
    settings = {"max_new_tokens": 16, "do_sample": False, "min_new_tokens": 16}
    tokens = last.generate(prompt, **settings)
    assert torch.equal(tokens, with_adapter.generate(input_ids=prompt, **settings))
    assert _logprobs(last, PROMPT, RESPONSE) == pytest.approx(run["logprobs"], abs=1e-5)


def test_the_merged_model_written_whole_is_the_streamed_one(run: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    streamed = load_file(str(run["last"] / "model" / "model.safetensors"))
    whole = load_file(str(run["whole"] / "model" / "model.safetensors"))
    assert streamed.keys() == whole.keys() and all(torch.equal(streamed[n], whole[n]) for n in streamed)
    assert not (run["whole"] / "master").exists()
    config = json.loads((run["whole"] / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"


def test_a_resume_onto_the_base_continues_bit_for_bit(run: dict[str, Any]) -> None:
    assert run["version"] == SAVED_AT
    saved, restored = run["at_save"], run["restored"]
    assert all(torch.equal(restored["adapter"][n], t) for n, t in saved["adapter"].items())
    for index, moments in saved["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(restored["optimizer"]["state"][index][key], value), (index, key)
    assert run["resumed_losses"] == run["losses"]
    assert all(torch.equal(run["resumed_adapter"][n], t) for n, t in run["adapter"].items())


def test_final_publishes_the_merged_model_and_the_adapter(run: dict[str, Any]) -> None:
    final = run["final"]
    assert final.name == checkpoint.FINAL_DIR and (final / "model.safetensors").is_file()
    assert (final / "adapter" / "adapter_model.safetensors").is_file()
    assert (final / "adapter" / "adapter_model.safetensors").stat().st_ino == (
        run["last"] / "adapter" / "adapter_model.safetensors"
    ).stat().st_ino  # a hard link, no second copy
    assert checkpoint.read_final(final.parent)["step"] == STEPS  # type: ignore[index]


def test_a_lora_checkpoint_and_a_full_one_are_not_resumed_by_the_other_kind_of_student(
    run: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    full = tmp_path / "step-00000002"
    shutil.copytree(run["saved"], full)
    shutil.rmtree(full / "adapter")
    (full / "master").mkdir()
    ref = checkpoint.CheckpointRef(SAVED_AT, full)
    assert checkpoint.weights_dir(ref, base=run["student"]) == full / "master" and not checkpoint.is_lora(ref)
    with pytest.raises(checkpoint.CheckpointReadError, match="checkpoint of full fine-tuning"):
        checkpoint.read_adapter(ref)
    with pytest.raises(ValueError, match="resumes onto the student model"):
        checkpoint.weights_dir(checkpoint.CheckpointRef(SAVED_AT, run["saved"]))
    with pytest.raises(checkpoint.CheckpointReadError, match=r"^a/: refused: not this student's adapter"):
        run["trainer"].load_adapter({"base_model.model.lm_head.weight": torch.zeros(VOCAB, 64)}, source="a/")
    # A job that dropped spec.student.lora does not resume its LoRA checkpoints.
    full = TrainerWorker(str(run["student"]), dataclasses.replace(SETTINGS, lora=None), 0, 1)
    with pytest.raises(checkpoint.CheckpointReadError, match="this student trains every weight"):
        full.load_state(str(run["saved"]))


def test_the_preflight_counts_the_merged_model_and_the_adapter_not_14_bytes_a_parameter(
    tmp_path: Path,
) -> None:
    parameters, adapter = 1_000_000, 10_000
    needed = checkpoint_bytes(parameters, 2, adapter)
    assert needed == parameters * 2 + adapter * 12 < checkpoint_bytes(parameters, 2) == parameters * 14
    checkpoint.preflight(tmp_path / "a", parameters, field="f", free_bytes=2 * needed, adapter=adapter)
    with pytest.raises(checkpoint.PreflightError, match=r"the merged model, 1.00M parameters x 2 bytes"):
        checkpoint.preflight(
            tmp_path / "b", parameters, field="f", free_bytes=2 * needed - 1, adapter=adapter
        )
    with pytest.raises(checkpoint.PreflightError):  # full fine-tuning would not fit there
        checkpoint.preflight(tmp_path / "c", parameters, field="f", free_bytes=2 * needed)


# ---------------------------------------------------------------- two FSDP2 ranks: save and resume

FSDP = dataclasses.replace(SETTINGS, sharding=Sharding.FSDP)


def _fsdp_worker(rank: int, world: int, init: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.use_deterministic_algorithms(True)
    worker = TrainerWorker(model_dir, FSDP, rank, world)
    _steps(worker, range(SAVED_AT), rank, world)
    saved, _ = worker.save_checkpoint(
        f"{out}/ckpt", SAVED_AT, {"version": SAVED_AT}, 2, _export(Path(model_dir)), False
    )
    at_save = _adapter(worker)
    losses = _steps(worker, range(SAVED_AT, STEPS), rank, world)
    adapter = _adapter(worker)
    ref = checkpoint.latest(f"{out}/ckpt")
    assert ref is not None
    resumed = TrainerWorker(str(checkpoint.weights_dir(ref, base=model_dir)), FSDP, rank, world)
    resumed.load_state(str(ref.path))
    restored = _adapter(resumed)
    resumed_losses = _steps(resumed, range(SAVED_AT, STEPS), rank, world)
    result = {
        "saved": saved,
        "at_save": at_save,
        "losses": losses,
        "adapter": adapter,
        "restored": restored,
        "resumed_losses": resumed_losses,
        "resumed_adapter": _adapter(resumed),
    }
    torch.save(result, f"{out}/rank-{rank}.pt")
    dist.destroy_process_group()


def test_two_fsdp_ranks_save_the_merged_model_and_resume_bit_for_bit(
    student: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spawned ranks import this module by its name (tests.runtime...), with the parent's sys.path.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    mp.start_processes(
        _fsdp_worker,
        args=(2, f"file://{tmp_path}/init", str(student), str(tmp_path)),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    zero = ranks[0]
    saved = Path(zero["saved"])
    assert not (saved / "master").exists() and (saved / "adapter" / "adapter_config.json").is_file()
    # Rank 0 gathered the adapter whole; the loss of a step is the sum of the ranks' parts.
    assert zero["at_save"] and ranks[1]["at_save"] == {}
    adapter = checkpoint.read_adapter(checkpoint.CheckpointRef(SAVED_AT, saved))
    assert all(torch.equal(adapter[n], t) for n, t in zero["at_save"].items())
    assert all(torch.equal(zero["restored"][n], t) for n, t in zero["at_save"].items())
    for rank in ranks:
        assert rank["resumed_losses"] == rank["losses"]
    assert all(torch.equal(zero["resumed_adapter"][n], t) for n, t in zero["adapter"].items())
    # model/ is the merge of what adapter/ holds, streamed from the shards.
    from transformers import AutoModelForCausalLM

    merged = _peft(student, saved / "adapter").merge_and_unload().state_dict()
    kept = AutoModelForCausalLM.from_pretrained(saved / "model").state_dict()
    assert kept.keys() == merged.keys()
    for name, tensor in kept.items():
        torch.testing.assert_close(
            tensor.float(), merged[name].to(torch.bfloat16).float(), rtol=0, atol=0, msg=name
        )
