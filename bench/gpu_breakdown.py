"""Issue 8 on one GPU, Ray left out: where each system's step time goes, and the loss's memory.

    python bench/gpu_breakdown.py                       # on a CUDA machine with TRL (and vLLM, if it has it)
    python bench/gpu_breakdown.py --device cpu --scales tiny --steps 3   # a smoke run of the script

The lent GPU machines carry torch and transformers but not vLLM or Ray (their CUDA wheels are
larger than what can be taken there), so `distillery run` itself cannot run on them. What can:
1. TRL on the GPU: `GKDTrainer` (lmbda=1, beta=1) and `DistillationTrainer` (beta=1), the same
   random-Llama speed settings as bench/e2e_vs_trl.py (32 prompts/step, 128 new tokens, bf16),
   seconds per step and the seconds inside HF `generate` (the rollout share of the step).
2. Distillery's own phases, in this process: the trainer's step (`distillery_runtime.training.trainer`,
   bf16 autocast, reverse_kl_topk with k=16), the teacher's scoring (a bf16 forward over prompt +
   response and its top-k, which is what the vLLM teacher computes; vLLM's prefill is at least as
   fast), and the weight sync (the copy to host in bf16). Where vLLM is installed, the rollout runs in
   Distillery's vLLM engine (`rollout/vllm_engine.py`, CUDA graphs on a GPU), its samples are the ones
   scored and trained on, and the sync includes the engine's weight reload: the in-process step time
   and its ratio to TRL GKD's are printed (Ray and HTTP overheads are not in it). Without vLLM (the
   lent GPU machines): the rollout time Distillery's step may take for it to run 2x TRL's steps per
   second, `TRL s/step / 2 - (score + train + sync)`, to hold against vLLM's decode time elsewhere.
3. Loss memory at Qwen vocabulary (151,936) on the GPU: peak CUDA memory and time of one forward +
   backward of Distillery's `reverse_kl_topk` (student logits + teacher top-k) against TRL GKD's
   `generalized_jsd_loss` at beta=1 (student and teacher full-vocabulary logits).

Each part appends to `--output`/results.jsonl as it finishes (a killed run keeps what it measured);
the last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import e2e_vs_trl  # noqa: E402  (the bench's own module: settings and the TRL runner)
from _common import json_main  # noqa: E402  (bench/, the script's own folder)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# ------------------------------------------------------------------------------------------ part 1: TRL


def trl_part(setting: e2e_vs_trl.Setting, system: str, out: Path) -> dict:
    run = e2e_vs_trl.run_trl(system, setting, out / setting.name / system)
    later = [sec for step, sec, _ in run["steps"] if step > 1]  # step 1 is warm-up
    gen = [sec for step, sec in run["generate_s"] if step > 1]
    return {
        "part": "trl",
        "setting": setting.name,
        "system": system,
        "median_s": _median(later),
        "generate_median_s": _median(gen),
        "steps": len(run["steps"]),
        "wall_s": run["wall_s"],
    }


# ------------------------------------------------------------------------------------------ part 2: Distillery's phases


def _teacher_targets(teacher, pairs: list[tuple[list[int], list[int]]], top_k: int, device: str, pad: int):  # type: ignore[no-untyped-def]
    """The teacher's scoring: one forward over prompt + response (right-padded), and per response position
    its top-k log-probs and the sampled token's log-prob (numpy, as the teacher server returns them)."""
    import torch

    length = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), length), pad, dtype=torch.long)
    mask = torch.zeros((len(pairs), length), dtype=torch.long)
    for i, (p, r) in enumerate(pairs):
        ids[i, : len(p) + len(r)] = torch.tensor([*p, *r])
        mask[i, : len(p) + len(r)] = 1
    ids, mask = ids.to(device), mask.to(device)
    out = []
    with torch.no_grad():
        logits = teacher(input_ids=ids, attention_mask=mask).logits
        for i, (p, r) in enumerate(pairs):
            logp = torch.log_softmax(logits[i, len(p) - 1 : len(p) + len(r) - 1].float(), dim=-1)
            top_lp, top_ids = logp.topk(top_k, dim=-1)
            token_lp = logp.gather(-1, ids[i, len(p) : len(p) + len(r), None])[:, 0]
            out.append((top_ids.int().cpu().numpy(), top_lp.cpu().numpy(), token_lp.cpu().numpy()))
    return out


def distillery_part(setting: e2e_vs_trl.Setting, steps: int, top_k: int = 16, use_vllm: bool = True) -> dict:
    """Distillery's step in one process on this device: rollout in vLLM (when installed; HF generate is
    timed too, as the reference), the teacher's scoring, the trainer's step and the weight sync (the copy
    to host, plus the rollout engine's reload when vLLM runs). No Ray, no HTTP: those costs are not here."""
    import torch
    from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
    from distillery_runtime.training.trainer import Trainer, step_normalizer
    from transformers import AutoModelForCausalLM

    from distillery.api.spec import LossMode, Precision
    from distillery.plan.loss import LossConfig
    from distillery.plan.training import TrainerSettings

    device = setting.device
    trainer = Trainer(
        setting.student,
        TrainerSettings(
            lr=setting.lr, micro_batch_size=setting.prompts_per_step, precision=Precision(setting.precision),
            loss=LossConfig(mode=LossMode.REVERSE_KL_TOPK), total_steps=steps,
        ),
        device=device,
    )  # fmt: skip
    dtype = torch.bfloat16 if setting.precision == "bfloat16" else torch.float32
    teacher = AutoModelForCausalLM.from_pretrained(setting.teacher, dtype=dtype).to(device).eval()
    tok = trainer.tokenizer
    tok.padding_side = "left"
    prompts = [json.loads(line)["prompt"] for line in Path(setting.train).read_text().splitlines()]
    engine, engine_start_s = _vllm_engine(setting, dtype) if use_vllm else (None, 0.0)
    sampling = SamplingSettings(temperature=setting.temperature, max_new_tokens=setting.max_new_tokens)
    phases: dict[str, list[float]] = {"hf_generate": [], "score": [], "train": [], "sync": []}
    if engine is not None:
        phases["vllm_rollout"] = []
    sync_exact = False
    for step in range(steps):
        batch = prompts[step * setting.prompts_per_step : (step + 1) * setting.prompts_per_step]
        enc = tok(batch, return_tensors="pt", padding=True).to(device)
        timing: dict[str, float] = {}
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad(), trainer._autocast():
            gen = trainer.model.generate(
                **enc, do_sample=True, temperature=setting.temperature,
                max_new_tokens=setting.max_new_tokens, pad_token_id=trainer.pad_id,
            )  # fmt: skip
        _sync(device)
        timing["hf_generate"] = time.perf_counter() - t0
        plen = enc["input_ids"].shape[1]
        prompt_ids = [
            row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)
        ]
        pairs = [(p, row[plen:].tolist()) for p, row in zip(prompt_ids, gen, strict=True)]
        if engine is not None:  # Distillery's rollout: these samples are the ones scored and trained on
            requests = [
                GenerationRequest(f"{step}-{i}", tuple(p), seed=step * 1000 + i)
                for i, p in enumerate(prompt_ids)
            ]
            t0 = time.perf_counter()
            pairs = [
                (s.prompt_ids, s.response_ids) for done in engine.generate(requests, sampling) for s in done
            ]
            timing["vllm_rollout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        targets = _teacher_targets(teacher, pairs, top_k, device, trainer.pad_id)
        timing["score"] = time.perf_counter() - t0
        samples = _train_samples(pairs, targets)
        t0 = time.perf_counter()
        trainer.train_step(samples, step_normalizer(samples, trainer.settings.loss))
        _sync(device)
        timing["train"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        synced = trainer.weights(torch.bfloat16 if dtype == torch.bfloat16 else None)
        if engine is not None:
            engine.update_weights(synced, trainer.version)
        timing["sync"] = time.perf_counter() - t0
        if step == 0:  # what the rollout engine loads is the trained weights, cast
            live = trainer.model.state_dict()
            sync_exact = all(torch.equal(w, live[n].detach().to(w.dtype).cpu()) for n, w in synced)
        del synced
        if step > 0:  # step 0 is warm-up (kernels, allocator, graph capture)
            for name, values in phases.items():
                values.append(timing[name])
    del trainer, teacher, engine
    if device == "cuda":
        torch.cuda.empty_cache()
    result: dict = {f"{name}_median_s": _median(v) for name, v in phases.items()}
    result["score_train_sync_s"] = sum(result[f"{n}_median_s"] or 0.0 for n in ("score", "train", "sync"))
    if "vllm_rollout" in phases:
        result["step_s"] = result["score_train_sync_s"] + (result["vllm_rollout_median_s"] or 0.0)
        result["vllm_engine_start_s"] = engine_start_s
    result["vllm"] = "vllm_rollout" in phases
    return {"part": "distillery", "setting": setting.name, **result, "sync_exact": sync_exact, "steps": steps}


# ------------------------------------------------------------------------------------------ part 3: loss memory


def _vllm_engine(setting: e2e_vs_trl.Setting, dtype: Any) -> tuple[Any, float]:
    """Distillery's vLLM rollout engine for the student and the seconds it took to start; (None, 0) where
    vLLM is not installed (the lent GPU machines have none)."""
    try:
        from distillery_runtime.rollout.vllm_engine import VllmRolloutEngine
    except ImportError:
        return None, 0.0
    started = time.perf_counter()
    engine = VllmRolloutEngine(
        setting.student, dtype=dtype, max_model_len=256 + setting.max_new_tokens,
        enforce_eager=None if setting.device == "cuda" else setting.enforce_eager,
    )  # fmt: skip
    return engine, time.perf_counter() - started


def _train_samples(pairs: list, targets: list) -> list:
    """The trainer's samples of (prompt, response) pairs with their teacher's top-k and token log-probs."""
    import numpy as np
    from distillery_runtime.data.samples import TrainSample

    return [
        TrainSample(
            prompt_ids=p,
            response_ids=r,
            old_logprobs=None,
            topk_ids=ids,
            topk_logprobs=lps,
            token_logprobs=token,
            teacher_mask=np.ones(len(r), bool),
        )
        for (p, r), (ids, lps, token) in zip(pairs, targets, strict=True)
    ]


def loss_memory_part(device: str, tokens: int, vocab: int, top_k: int) -> list[dict]:
    import torch
    from distillery_runtime.losses import TeacherTargets, distillation_loss

    from distillery.api.spec import LossMode
    from distillery.plan.loss import LossConfig

    def measure(name: str, build, loss_fn) -> dict:  # type: ignore[no-untyped-def]
        for _ in range(2):  # the first run warms up (kernel loading, allocator); the second is reported
            inputs = build()
            _sync(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            loss = loss_fn(*inputs)
            loss.backward()
            _sync(device)
            seconds = time.perf_counter() - t0
            row = {"part": "loss_memory", "impl": name, "tokens": tokens, "vocab": vocab, "seconds": seconds}
            if device == "cuda":
                # Beyond the inputs: what the loss costs, the student's gradient [N, V] included.
                row["extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
                row["gradient_gib"] = tokens * vocab * 4 / 2**30
            row["loss"] = float(loss.detach())
            del inputs, loss
            if device == "cuda":
                torch.cuda.empty_cache()
        return row

    gen = torch.Generator(device=device).manual_seed(0)

    def student() -> torch.Tensor:
        return (torch.randn(1, tokens, vocab, device=device, generator=gen) * 2).requires_grad_()

    def ours_inputs():  # type: ignore[no-untyped-def]
        t = torch.log_softmax(torch.randn(1, tokens, vocab, device=device, generator=gen) * 2, -1)
        lp, ids = t.topk(top_k, dim=-1)
        del t
        s = student()
        response = ids[..., 0]
        return (
            s,
            response,
            torch.ones(1, tokens, dtype=torch.bool, device=device),
            TeacherTargets(ids, lp, lp[..., 0]),
        )

    def ours(s, response, mask, targets):  # type: ignore[no-untyped-def]
        return distillation_loss(s, response, mask, targets, LossConfig(mode=LossMode.REVERSE_KL_TOPK)).loss

    def trl_inputs():  # type: ignore[no-untyped-def]
        return student(), torch.randn(1, tokens, vocab, device=device, generator=gen) * 2

    from trl.experimental.gkd import GKDTrainer  # imported here: outside the timed region

    def trl(s, t):  # type: ignore[no-untyped-def]
        return GKDTrainer.generalized_jsd_loss(s, t, beta=1.0)

    rows = [measure("distillery reverse_kl_topk", ours_inputs, ours)]
    try:
        rows.append(measure("trl generalized_jsd_loss beta=1", trl_inputs, trl))
    except torch.OutOfMemoryError as error:
        rows.append(
            {"part": "loss_memory", "impl": "trl generalized_jsd_loss beta=1", "oom": str(error)[:200]}
        )
    return rows


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--scales", nargs="*", default=["large", "xl", "medium"], choices=list(e2e_vs_trl.SPEED_MODELS)
    )
    parser.add_argument(
        "--steps", type=int, default=6, help="steps per system and scale (the first is warm-up)"
    )
    parser.add_argument(
        "--parts", nargs="*", default=["distillery", "trl", "loss"], choices=["distillery", "trl", "loss"]
    )
    parser.add_argument(
        "--trl-systems", nargs="*", default=["trl-gkd", "trl-distill"], choices=["trl-gkd", "trl-distill"]
    )
    parser.add_argument(
        "--no-vllm", action="store_true", help="skip the vLLM rollout even where vLLM is installed"
    )
    parser.add_argument("--loss-tokens", type=int, default=8192)
    parser.add_argument("--loss-vocab", type=int, default=151_936)
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "bench-gpu")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    results_file = args.output / "results.jsonl"
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        with open(results_file, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), file=sys.stderr, flush=True)

    import torch

    machine = {"device": args.device, "torch": torch.__version__}
    if args.device == "cuda":
        machine["gpu"] = torch.cuda.get_device_name()
    record({"part": "machine", **machine})
    if "loss" in args.parts:  # first: it takes seconds, the scales take minutes
        for row in loss_memory_part(args.device, args.loss_tokens, args.loss_vocab, top_k=16):
            record(row)
    for scale in args.scales:
        started = time.perf_counter()
        setting = e2e_vs_trl.speed_setting(args.output, args.steps, scale, "bfloat16", device=args.device)
        record({"part": "models", "setting": setting.name, "build_s": time.perf_counter() - started})
        if "distillery" in args.parts:
            record(distillery_part(setting, args.steps, use_vllm=not args.no_vllm))
        if "trl" in args.parts:
            for system in args.trl_systems:
                try:
                    record(trl_part(setting, system, args.output))
                except RuntimeError as error:  # one system failing must not lose the others' numbers
                    record({"part": "trl", "setting": setting.name, "system": system, "failed": str(error)})

    print_table(rows)
    print(json.dumps({"bench": "gpu_breakdown", "rows": rows}))
    return 0


def print_table(rows: list[dict]) -> None:
    settings = [r["setting"] for r in rows if r["part"] == "models"]
    print(
        f"\n{'setting':<16} {'system':<12} {'s/step':>8} {'generate s':>10} {'score s':>8} {'train s':>8} {'sync s':>7}"
    )
    for name in settings:
        for r in rows:
            if r.get("setting") != name:
                continue
            if r["part"] == "trl" and "median_s" in r:
                print(
                    f"{name:<16} {r['system']:<12} {r['median_s'] or 0:>8.3f} {r['generate_median_s'] or 0:>10.3f}"
                )
            elif r["part"] == "distillery":
                print(
                    f"{name:<16} {'distillery':<12} {'-':>8} {r['hf_generate_median_s'] or 0:>10.3f} "
                    f"{r['score_median_s'] or 0:>8.3f} {r['train_median_s'] or 0:>8.3f} {r['sync_median_s'] or 0:>7.3f}"
                )
        d = next((r for r in rows if r["part"] == "distillery" and r["setting"] == name), None)
        g = next(
            (r for r in rows if r["part"] == "trl" and r.get("system") == "trl-gkd" and r["setting"] == name),
            None,
        )
        if d and d.get("step_s"):
            line = f"{name:<16} Distillery step in one process (vLLM rollout {d['vllm_rollout_median_s']:.3f} s): {d['step_s']:.3f} s"
            if g and g.get("median_s"):
                line += f", {g['median_s'] / d['step_s']:.2f}x TRL GKD's steps/s (no Ray/HTTP overheads)"
            print(line)
        if d and g and g.get("median_s"):
            budget = g["median_s"] / 2 - d["score_train_sync_s"]
            print(
                f"{name:<16} rollout budget for 2x trl-gkd: {budget:.3f} s (TRL's HF generate: {g['generate_median_s']:.3f} s)"
            )
    for r in rows:
        if r["part"] == "loss_memory":
            mem = f"{r['extra_gib']:.2f} GiB beyond inputs" if "extra_gib" in r else r.get("oom", "")
            print(f"loss {r['impl']:<32} {r.get('seconds', 0):.3f} s  {mem}")


if __name__ == "__main__":
    raise SystemExit(json_main("gpu_breakdown", main))
