"""The student's training step: micro-batches, loss, backward, gradient all-reduce, clip, AdamW, schedule.

One `Trainer` per data-parallel rank. Each rank gets its share of the step's samples plus the step's
global token (or sequence) count, so that every micro-batch's loss is weighted by its share of the whole
step: the summed gradient is then the gradient of the step's loss whatever the split over ranks and
micro-batches (2 ranks x 2 micro-batches == 1 rank x 4). Gradients are summed across ranks with
torch.distributed (gloo on CPU, nccl on GPU). Master weights stay float32; bf16 autocast where supported.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distillery_runtime.losses import LossConfig, TeacherTargets, distillation_loss
from distillery_runtime.samples import TrainSample
from distillery_runtime.schedule import lr_factor

COUNT_METRICS = frozenset({"distill/tokens", "distill/teacher_pad_tokens"})
"""Loss metrics that are counts: summed over micro-batches and ranks, not averaged."""
SUMMED_OVER_RANKS = COUNT_METRICS | {"distill/loss"}


@dataclass(frozen=True)
class TrainerSettings:
    """What a rank needs to know to train (copied from the spec, plain values)."""

    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0
    micro_batch_size: int = 8
    precision: str = "auto"
    seed: int = 0
    loss: LossConfig = field(default_factory=LossConfig)


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on a GPU that supports it, float32 otherwise (CPU runs stay deterministic)."""
    if precision == "bfloat16":
        return torch.bfloat16
    if precision == "float32":
        return torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def counted_positions(sample: TrainSample, loss: LossConfig) -> np.ndarray:
    """Response positions that enter the loss: scored by the teacher, with a finite target."""
    if loss.uses_topk:
        finite = (
            np.isfinite(sample.topk_logprobs).any(axis=-1)
            if sample.topk_logprobs.shape[-1]
            else np.zeros(len(sample.response_ids), dtype=bool)
        )
    else:
        finite = np.isfinite(sample.token_logprobs)
    return sample.teacher_mask & finite


def step_normalizer(samples: Sequence[TrainSample], loss: LossConfig) -> float:
    """The denominator of the step's loss over ALL ranks' samples: tokens, sequences or 1."""
    if loss.reduction == "sum":
        return 1.0
    counts = [int(counted_positions(s, loss).sum()) for s in samples]
    if loss.reduction == "sequence_mean":
        return float(max(sum(1 for c in counts if c > 0), 1))
    return float(max(sum(counts), 1))


def collate(samples: Sequence[TrainSample], loss: LossConfig, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs plus, per response position, the index of the logit that predicts it."""
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    t_max = max(len(s.response_ids) for s in samples)
    k = samples[0].topk_ids.shape[-1] if loss.uses_topk else 0
    b, l_max = len(samples), max(lengths)
    input_ids = torch.full((b, l_max), pad_id, dtype=torch.long)
    attention = torch.zeros((b, l_max), dtype=torch.long)
    positions = torch.zeros((b, t_max), dtype=torch.long)
    response = torch.zeros((b, t_max), dtype=torch.long)
    mask = torch.zeros((b, t_max), dtype=torch.bool)
    old = torch.zeros((b, t_max), dtype=torch.float32)
    have_old = all(s.old_logprobs is not None for s in samples)
    token_lp = torch.full((b, t_max), float("-inf"))
    topk_ids = torch.zeros((b, t_max, k), dtype=torch.long)
    topk_lp = torch.full((b, t_max, k), float("-inf"))
    advantages = torch.zeros((b, t_max))
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + r] = torch.tensor([*s.prompt_ids, *s.response_ids])
        attention[i, : p + r] = 1
        positions[i, :r] = torch.arange(p - 1, p + r - 1)
        response[i, :r] = torch.tensor(s.response_ids)
        mask[i, :r] = torch.from_numpy(counted_positions(s, loss))
        token_lp[i, :r] = torch.from_numpy(np.asarray(s.token_logprobs, dtype=np.float32))
        if k:
            topk_ids[i, :r] = torch.from_numpy(np.asarray(s.topk_ids[:, :k], dtype=np.int64))
            topk_lp[i, :r] = torch.from_numpy(np.asarray(s.topk_logprobs[:, :k], dtype=np.float32))
        if have_old and s.old_logprobs is not None:
            old[i, :r] = torch.from_numpy(np.asarray(s.old_logprobs, dtype=np.float32))
        advantages[i, :r] = s.task_advantage
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "positions": positions,
        "response_ids": response,
        "mask": mask,
        "token_logprobs": token_lp,
        "topk_ids": topk_ids,
        "topk_logprobs": topk_lp,
        "advantages": advantages,
    }
    if have_old:
        batch["old_logprobs"] = old
    return batch


class Trainer:
    """One data-parallel rank: the student model, its optimizer and schedule."""

    def __init__(
        self,
        model_dir: str,
        settings: TrainerSettings,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.settings = settings
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.compute_dtype = resolve_precision(settings.precision, self.device)
        torch.manual_seed(settings.seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)  # type: ignore[arg-type]
        self.model.train()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_factor(
                step,
                warmup_steps=settings.warmup_steps,
                total_steps=settings.total_steps,
                min_lr_ratio=settings.min_lr_ratio,
            ),
        )
        self.version = 0
        """Optimizer steps taken (the policy version the rollout engine is synced to)."""

    # ------------------------------------------------------------------------------------------ step

    def _autocast(self) -> Any:
        enabled = self.compute_dtype != torch.float32
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=enabled)

    def _micro_batch_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float], int]:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        loss_cfg = self.settings.loss
        with self._autocast():
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        # Logits of the positions that predict each response token: [B, T, V].
        index = batch["positions"].unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        student = logits.gather(1, index).float()
        teacher = TeacherTargets(
            topk_ids=batch["topk_ids"] if loss_cfg.uses_topk else None,
            topk_logprobs=batch["topk_logprobs"] if loss_cfg.uses_topk else None,
            token_logprobs=batch["token_logprobs"],
        )
        out = distillation_loss(
            student,
            batch["response_ids"],
            batch["mask"],
            teacher,
            loss_cfg,
            old_logprobs=batch.get("old_logprobs"),
            task_advantages=batch["advantages"] if loss_cfg.task_reward_coef > 0 else None,
        )
        if loss_cfg.reduction == "sequence_mean":
            share = int((batch["mask"].sum(-1) > 0).sum())
        elif loss_cfg.reduction == "token_mean":
            share = int(batch["mask"].sum())
        else:
            share = 1
        return out.loss, out.metrics, share

    def train_step(self, samples: Sequence[TrainSample], normalizer: float) -> dict[str, float]:
        """One optimizer step on this rank's samples; `normalizer` is step_normalizer() of ALL ranks'."""
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        mb = self.settings.micro_batch_size
        weighted_sums: dict[str, float] = {}
        total_share = 0
        step_loss = 0.0
        for start in range(0, len(samples), mb):
            batch = collate(samples[start : start + mb], self.settings.loss, self.pad_id)
            loss, metrics, share = self._micro_batch_loss(batch)
            weight = share / normalizer if self.settings.loss.reduction != "sum" else 1.0
            (loss * weight).backward()
            step_loss += float(loss.detach()) * weight
            total_share += share
            for name, value in metrics.items():
                add = value if name in COUNT_METRICS else value * share
                weighted_sums[name] = weighted_sums.get(name, 0.0) + add
        self._all_reduce_gradients()
        grad_norm = self._clip()
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.version += 1
        metrics = {
            name: value if name in COUNT_METRICS else value / max(total_share, 1)
            for name, value in weighted_sums.items()
        }
        metrics.update(
            {
                # This rank's part of the step's loss: the ranks' parts add up to the step's loss.
                "distill/loss": step_loss,
                "train/grad_norm": grad_norm,
                "train/lr": lr,
                "train/samples": float(len(samples)),
                "train/share": float(total_share),
                "train/seconds": time.perf_counter() - started,
            }
        )
        return metrics

    def _all_reduce_gradients(self) -> None:
        if self.world_size == 1 or not dist.is_initialized():
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                # A rank with no samples this step (fewer samples than ranks) still joins the all-reduce,
                # with zeros: the same tensors in the same order on every rank, or the collective hangs.
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        # SUM, not mean: every rank already weighted its loss by its share of the global step.
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.settings.grad_clip > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, self.settings.grad_clip))
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))

    # ------------------------------------------------------------------------------------------ sync, state

    def weights(self, dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
        """The student's weights by Hugging Face name, on CPU (what the rollout engine loads).

        On a GPU the cast runs there, before the copy (half the bytes for bf16, no cast on the CPU),
        and the copies go asynchronously into pinned memory with one synchronisation at the end. The
        per-tensor blocking copy of float32 followed by a CPU cast took 1.95 s for a 0.68B student
        on an H100 (bench/gpu_breakdown.py), as long as the whole training step and teacher scoring.
        """
        on_gpu = self.device.type == "cuda"
        out = []
        for name, tensor in self.model.state_dict().items():
            t = tensor.detach()
            cast = dtype is not None and t.is_floating_point() and t.dtype != dtype
            if cast:
                t = t.to(dtype)
            if on_gpu:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
            else:
                host = t if cast else t.clone()  # a copy: the caller must not hold live parameters
            out.append((name, host))
        if on_gpu:
            torch.cuda.synchronize(self.device)
        return out

    def gradients(self) -> dict[str, torch.Tensor]:
        """The last step's gradients after all-reduce and clipping (what the optimizer applied)."""
        return {
            n: p.grad.detach().cpu().clone() for n, p in self.model.named_parameters() if p.grad is not None
        }

    @torch.no_grad()
    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Log-prob of each response token under the current weights (for checks and tests)."""
        ids = torch.tensor([[*prompt_ids, *response_ids]], device=self.device)
        with self._autocast():
            logits = self.model(input_ids=ids).logits.float()
        p = len(prompt_ids)
        logp = torch.log_softmax(logits[0, p - 1 : -1], dim=-1)
        return logp.gather(-1, torch.tensor(response_ids, device=self.device)[:, None])[:, 0].tolist()

    def trainer_state(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
