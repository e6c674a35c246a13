"""The model you keep: a checkpoint's model/ is what `from_pretrained` and `vllm serve` load as is (the
job's dtype, tokenizer and generation config), and a finished run's final/ names it for good."""

from __future__ import annotations

import os

import orjson
import pytest
import torch
from distillery_runtime.checkpoints import checkpoint
from distillery_runtime.checkpoints.export import ModelExport, cast_state_dict, generation_config
from transformers import AutoModelForCausalLM, AutoTokenizer

OVERRIDE_TEMPLATE = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}<<assistant>>"


def _save(root, step, model, tok, *, export=None, run=None, keep=2):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return checkpoint.save(
        root,
        step,
        model=model,
        tokenizer=tok,
        trainer_state={"optimizer": optimizer.state_dict(), "rng": checkpoint.rng_state()},
        state={"position": step, "version": step, "run": run},
        keep=keep,
        export=export,
    )


@pytest.fixture
def override_tokenizer(job_files, tmp_path):
    """The student's tokenizer given another chat template and another eos (an instruct tokenizer over a
    base model), saved as a folder of its own, as `student.tokenizer` names one."""
    tok = AutoTokenizer.from_pretrained(job_files.student)
    tok.chat_template = OVERRIDE_TEMPLATE
    eos = tok.convert_ids_to_tokens(7)
    tok.eos_token = eos
    tok.save_pretrained(tmp_path / "override")
    return AutoTokenizer.from_pretrained(tmp_path / "override")


def test_model_folder_is_the_jobs_dtype_tokenizer_and_generation_config(
    job_files, tmp_path, override_tokenizer
):
    model = AutoModelForCausalLM.from_pretrained(job_files.student, dtype=torch.float32)
    student_tok = AutoTokenizer.from_pretrained(job_files.student)
    export = ModelExport(dtype="bfloat16", tokenizer=override_tokenizer)
    path = _save(tmp_path / "ckpt", 1, model, student_tok, export=export)

    kept = AutoModelForCausalLM.from_pretrained(path / "model")
    assert kept.dtype == torch.bfloat16
    assert orjson.loads((path / "model" / "config.json").read_bytes())["dtype"] == "bfloat16"
    tok = AutoTokenizer.from_pretrained(path / "model")
    assert tok.chat_template == OVERRIDE_TEMPLATE and tok.eos_token_id == 7
    messages = [{"role": "user", "content": "2+2="}]
    assert tok.apply_chat_template(messages, tokenize=False) == override_tokenizer.apply_chat_template(
        messages, tokenize=False
    )
    # The student had no generation config of its own (transformers derived one from config.json): the
    # kept model's stops at the override's eos too, and the model config's eos stays a stop.
    generation = orjson.loads((path / "model" / "generation_config.json").read_bytes())
    assert generation["eos_token_id"] == [student_tok.eos_token_id, 7]
    assert kept.generation_config.eos_token_id == [student_tok.eos_token_id, 7]

    # master/ keeps the trainer's exact weights and the tokenizer the engines loaded, for a resume.
    master = AutoModelForCausalLM.from_pretrained(path / "master", dtype=torch.float32)
    for a, b in zip(model.state_dict().values(), master.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert AutoTokenizer.from_pretrained(path / "master").chat_template == student_tok.chat_template

    # float32 on request: the kept weights are then the master weights.
    path = _save(
        tmp_path / "ckpt32", 1, model, student_tok, export=ModelExport("float32", override_tokenizer)
    )
    for a, b in zip(
        model.state_dict().values(),
        AutoModelForCausalLM.from_pretrained(path / "model").state_dict().values(),
        strict=True,
    ):
        assert b.dtype == torch.float32 and torch.equal(a, b)


def test_generation_config_keeps_the_students_and_adds_the_tokenizers_eos():
    student = {
        "eos_token_id": [2, 5],
        "temperature": 0.7,
        "_from_model_config": False,
        "transformers_version": "x",
    }
    assert generation_config(student, own=True, eos=9, bos=1, pad=0) == {
        "eos_token_id": [2, 5, 9],
        "temperature": 0.7,
    }
    assert generation_config(student, own=True, eos=5, bos=1, pad=0)["eos_token_id"] == [2, 5]
    derived = {"eos_token_id": 2, "_from_model_config": True}
    assert generation_config(derived, own=False, eos=3, bos=1, pad=0) == {
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 0,
    }
    assert generation_config({}, own=False, eos=3, bos=None, pad=None) == {"eos_token_id": 3}


def test_cast_keeps_tied_tensors_shared():
    weight = torch.randn(4, 3)
    cast = cast_state_dict({"embed": weight, "head": weight, "steps": torch.arange(3)}, torch.bfloat16)
    assert cast["embed"] is cast["head"] and cast["embed"].dtype == torch.bfloat16
    assert cast["steps"].dtype == torch.long


def test_final_is_the_last_steps_model_published_atomically_and_never_pruned(job_files, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(job_files.student, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(job_files.student)
    root = tmp_path / "ckpt"
    for step in (1, 2):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        path = _save(root, step, model, tok, keep=1, run="uid-1")
    final = checkpoint.publish_final(checkpoint.CheckpointRef(2, path))
    assert final == root / "final"
    names = sorted(p.name for p in (path / "model").iterdir())
    assert sorted(p.name for p in final.iterdir()) == sorted([*names, checkpoint.FINAL_STATE])
    for name in names:  # the same files: hard links, no second copy on disk
        assert os.path.samefile(final / name, path / "model" / name)
    assert checkpoint.read_final(root) == {"step": 2, "run": "uid-1", "job": None, "checkpoint": path.name}
    AutoModelForCausalLM.from_pretrained(final)

    # Later saves prune step folders, never final/; a finished run publishing again replaces it whole.
    for step in (3, 4):
        path = _save(root, step, model, tok, keep=1, run="uid-1")
    assert [r.step for r in checkpoint.list_complete(root)] == [4]
    assert checkpoint.read_final(root)["step"] == 2
    checkpoint.publish_final(checkpoint.CheckpointRef(4, path))
    assert checkpoint.read_final(root)["step"] == 4
    assert sorted(p.name for p in root.iterdir()) == ["final", "step-00000004"]

    # Another run of the job over the same folder never replaces it.
    other = _save(root, 6, model, tok, keep=1, run="uid-2")
    with pytest.raises(checkpoint.CheckpointWriteError, match="final is the model of another run"):
        checkpoint.publish_final(checkpoint.CheckpointRef(6, other))
    assert checkpoint.read_final(root)["run"] == "uid-1"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
