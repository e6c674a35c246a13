"""Sharded checkpoints of the optimizer (trainer.save_optimizer_shards, workers.TrainerWorker.save_checkpoint):
two FSDP2 ranks each write their own AdamW shards with torch.distributed.checkpoint into the step folder,
trainer.pt holds no optimizer, and a resume onto 2 ranks takes exactly the steps the run would have taken
without stopping; onto 1 rank (DCP resharding) it holds exactly the optimizer state that was saved, and takes
the same steps to the round-off of 1 rank's sums against 2 ranks'. A resume with a
fresh optimizer does not: the steps after it depend on the state that was saved.

Real gloo ranks (torch.multiprocessing), as test_fsdp.py runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from distillery.api.spec import LossMode, ModelDtype, Precision, Sharding
from distillery.plan.checkpoints.export import ExportSettings
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from tests.runtime.helpers import train_steps

VOCAB = 64
SAVED_AT, STEPS = 2, 4
SETTINGS = TrainerSettings(
    lr=1e-3, weight_decay=0.1, grad_clip=0.5, micro_batch_size=2, precision=Precision.FLOAT32,
    total_steps=STEPS, warmup_steps=1, loss=LossConfig(mode=LossMode.FORWARD_KL_TOPK), sharding=Sharding.FSDP,
    sharded_load=True, sharded_checkpoint=True, streamed_export=True,
)  # fmt: skip


def _steps(worker: Any, rank: int, world: int, steps: range) -> list[float]:
    return train_steps(worker, SETTINGS.loss, VOCAB, steps, rank, world)


def _optimizer_state(worker: Any) -> dict[str, dict[str, torch.Tensor]]:
    """The whole AdamW state by parameter name (a collective), whatever the ranks' sharding."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(worker.trainer.model, worker.trainer.optimizer, options=options)
    return {name: {k: v.clone() for k, v in s.items()} for name, s in state["state"].items()}


def _worker(rank: int, world: int, init: str, phase: str, model_dir: str, out: str) -> None:
    import torch.distributed as dist
    from distillery_runtime.checkpoints import checkpoint
    from distillery_runtime.run.workers import TrainerWorker

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.use_deterministic_algorithms(True)
    result: dict[str, Any] = {}
    if phase == "run":
        worker = TrainerWorker(model_dir, SETTINGS, rank, world)
        _steps(worker, rank, world, range(SAVED_AT))
        export = ExportSettings(dtype=ModelDtype.BFLOAT16, tokenizer=model_dir)
        worker.save_checkpoint(f"{out}/ckpt", SAVED_AT, {"version": SAVED_AT}, 2, export, False)
        result["optimizer"] = _optimizer_state(worker)
        result["losses"] = _steps(worker, rank, world, range(SAVED_AT, STEPS))
        result["weights"] = worker.trainer.full_state_dict()
    else:
        ref = checkpoint.latest(f"{out}/ckpt")
        assert ref is not None
        worker = TrainerWorker(str(checkpoint.weights_dir(ref)), SETTINGS, rank, world)
        worker.load_state(str(ref.path))
        result["optimizer"] = _optimizer_state(worker)
        result["losses"] = _steps(worker, rank, world, range(SAVED_AT, STEPS))
        result["weights"] = worker.trainer.full_state_dict()
        # The same weights with a fresh optimizer: what the saved state changes.
        fresh = TrainerWorker(str(checkpoint.weights_dir(ref)), SETTINGS, rank, world)
        fresh.trainer.scheduler.load_state_dict(worker.trainer.scheduler.state_dict())
        result["fresh_losses"] = _steps(fresh, rank, world, range(SAVED_AT, STEPS))
    torch.save(result, f"{out}/{phase}-{world}-{rank}.pt")
    dist.destroy_process_group()


def _run(phase: str, world: int, tmp: Path, model_dir: Path) -> list[dict[str, Any]]:
    mp.start_processes(
        _worker, args=(world, f"file://{tmp}/init-{phase}-{world}", phase, str(model_dir), str(tmp)),
        nprocs=world, start_method="spawn",
    )  # fmt: skip
    return [torch.load(tmp / f"{phase}-{world}-{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from distillery_runtime.testing.tiny import build_tokenizer, save_tiny_model

    tmp = tmp_path_factory.mktemp("sharded-ckpt")
    tok = build_tokenizer(
        [f"{a}+{b}={a + b}" for a in range(50) for b in range(0, 50, 7)], VOCAB, full_byte_alphabet=False
    )
    model_dir = save_tiny_model(
        tmp / "student", tokenizer=tok, hidden=64, layers=2, heads=2, seed=3, dtype=torch.float32
    )
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
        out = {"run": _run("run", 2, tmp, model_dir), "tmp": tmp}
        out["resume2"] = _run("resume", 2, tmp, model_dir)
        out["resume1"] = _run("resume", 1, tmp, model_dir)
    yield out


def _summed(ranks: list[dict[str, Any]], key: str = "losses") -> list[float]:
    return [sum(r[key][i] for r in ranks) for i in range(STEPS - SAVED_AT)]


def test_each_rank_saves_its_optimizer_shards_and_trainer_pt_holds_none(runs: dict[str, Any]) -> None:
    from distillery_runtime.checkpoints import checkpoint

    ref = checkpoint.latest(runs["tmp"] / "ckpt")
    assert ref is not None and ref.step == SAVED_AT
    shards = ref.path / checkpoint.OPTIMIZER_DIR
    assert (shards / ".metadata").is_file() and len(list(shards.glob("*.distcp"))) == 2
    state = checkpoint.load_trainer_state(ref)
    assert "optimizer" not in state and state["version"] == SAVED_AT
    assert not list((runs["tmp"] / "ckpt").glob(".tmp-*"))


def test_a_resume_onto_as_many_ranks_takes_the_same_steps_exactly(runs: dict[str, Any]) -> None:
    for name, state in runs["run"][0]["optimizer"].items():
        for key, value in state.items():
            assert torch.equal(runs["resume2"][0]["optimizer"][name][key], value), (name, key)
    assert _summed(runs["resume2"]) == _summed(runs["run"])
    for name, value in runs["run"][0]["weights"].items():
        assert torch.equal(runs["resume2"][0]["weights"][name], value), name


def test_a_resume_onto_another_rank_count_reshards_the_optimizer(runs: dict[str, Any]) -> None:
    saved, resumed = runs["run"][0]["optimizer"], runs["resume1"][0]["optimizer"]
    assert saved.keys() == resumed.keys() and len(saved) > 0
    for name, state in saved.items():
        assert state.keys() == resumed[name].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in state.items():
            assert torch.equal(resumed[name][key], value), (name, key)
    # Then the same steps, to the round-off of 1 rank's sums against 2 ranks' (which AdamW's first steps
    # amplify: test_fsdp.py), far below what the saved state changes (test_the_saved_optimizer_state_matters).
    assert _summed(runs["resume1"]) == pytest.approx(_summed(runs["run"]), rel=5e-4)


def test_the_saved_optimizer_state_matters(runs: dict[str, Any]) -> None:
    # The first step after the resume reads the saved weights only; the second the optimizer state too.
    fresh, resumed = _summed(runs["resume2"], "fresh_losses"), _summed(runs["resume2"])
    assert fresh[0] == resumed[0]
    assert abs(fresh[1] - resumed[1]) > 2e-3 * abs(resumed[1])
