"""The student's training step: micro-batches, loss, backward, gradient all-reduce, clip, AdamW, schedule.

One `Trainer` per data-parallel rank, reading the resolved `distillery.plan.training.TrainerSettings`. Each
rank gets its share of the step's samples plus the step's normaliser (the global token or sequence count),
so that every micro-batch's loss is weighted by its share of the whole step, both counted by the one
`losses.reduction_units`: the summed gradient is then the gradient of the step's loss whatever the split
over ranks and micro-batches (2 ranks x 2 micro-batches == 1 rank x 4). Gradients are summed across ranks with
torch.distributed (gloo on CPU, nccl on GPU).

Two layouts (`student.training.sharding`): fsdp, FSDP2 over the ranks (`sharding.py`: sharded float32
master weights, gradients and AdamW state, bf16 compute where supported, optional CPU offload), and
replicate, a float32 copy per rank with bf16 autocast and one flat all-reduce. Micro-batches are either
`micro_batch_size` samples right-padded, or packed end to end up to a token budget (`micro_batch_tokens`:
one row, positions restarting at each sample, which transformers turns into a block-diagonal causal mask).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from distillery.api.spec import Precision, Sharding
from distillery.plan.attention import attention_kernel
from distillery.plan.loss import LossConfig
from distillery.plan.training import TrainerSettings
from distillery_runtime.data.packing import length_groups, pack_in_order
from distillery_runtime.data.samples import TrainSample
from distillery_runtime.losses import TeacherTargets, counted_tokens, distillation_loss, reduction_units
from distillery_runtime.training.schedule import lr_factor
from distillery_runtime.training.weights_and_state import TrainerWeightsAndState

if TYPE_CHECKING:
    pass

COUNT_METRICS = frozenset(
    {"distill/tokens", "distill/teacher_pad_tokens", "distill/teacher_topk_out_of_vocab"}
)
"""Loss metrics that are counts: summed over micro-batches and ranks, not averaged."""
SUMMED_OVER_RANKS = COUNT_METRICS | {"distill/loss"}
MAX_METRICS = frozenset({"distill/token_loss_max", "distill/logprob_gap_max"})
"""Loss metrics that are maxima: the largest over micro-batches and ranks (an average of maxima would
hide the one bad token they are there to show)."""


def resolve_precision(precision: Precision, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on a GPU that supports it, float32 otherwise (CPU runs stay deterministic)."""
    if precision == Precision.BFLOAT16:
        return torch.bfloat16
    if precision == Precision.FLOAT32:
        return torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def padded_targets(samples: Sequence[TrainSample], loss: LossConfig) -> dict[str, np.ndarray]:
    """The samples' per-position teacher targets and rollout log-probs, padded to [B, T(, K)] in numpy in
    one pass (tensors are made from them once, not per sample: a step of 64 short samples spent ~15% of
    its trainer time turning per-sample lists into tensors)."""
    b, t_max = len(samples), max((len(s.response_ids) for s in samples), default=0)
    k = samples[0].topk_ids.shape[-1] if loss.uses_topk and samples else 0
    out = {
        "teacher_mask": np.zeros((b, t_max), bool),
        "token_logprobs": np.full((b, t_max), -np.inf, np.float32),
        "topk_ids": np.zeros((b, t_max, k), np.int64),
        "topk_logprobs": np.full((b, t_max, k), -np.inf, np.float32),
        "old_logprobs": np.zeros((b, t_max), np.float32),
        "advantages": np.zeros((b, t_max), np.float32),
    }
    for i, s in enumerate(samples):
        r = len(s.response_ids)
        out["teacher_mask"][i, :r] = s.teacher_mask
        out["token_logprobs"][i, :r] = s.token_logprobs
        if k:
            out["topk_ids"][i, :r] = s.topk_ids[:, :k]
            out["topk_logprobs"][i, :r] = s.topk_logprobs[:, :k]
        if s.old_logprobs is not None:
            out["old_logprobs"][i, :r] = s.old_logprobs
        out["advantages"][i, :r] = s.task_advantage
    return out


def counted_positions(targets: dict[str, np.ndarray], loss: LossConfig) -> torch.Tensor:
    """Response positions that enter the loss (bool [B, T]) of `padded_targets`: scored by the teacher, with
    a finite target (`losses.counted_tokens`, the one owner of that rule)."""
    teacher = TeacherTargets(
        topk_ids=torch.from_numpy(targets["topk_ids"]),
        topk_logprobs=torch.from_numpy(targets["topk_logprobs"]),
        token_logprobs=torch.from_numpy(targets["token_logprobs"]),
    )
    return counted_tokens(torch.from_numpy(targets["teacher_mask"]), teacher, loss)


def step_normalizer(samples: Sequence[TrainSample], loss: LossConfig) -> float:
    """The denominator of the step's loss over ALL ranks' samples: tokens, sequences or 1."""
    counts = counted_positions(padded_targets(samples, loss), loss).sum(-1)
    return float(max(int(reduction_units(counts, loss.reduction)), 1))


def sample_tokens(sample: TrainSample) -> int:
    return len(sample.prompt_ids) + len(sample.response_ids)


def micro_batches(
    samples: Sequence[TrainSample], size: int, token_budget: int | None, forward_cost: int | None = None
) -> list[list[TrainSample]]:
    """The step's micro-batches. Padded: at most `size` samples each, grouped by length, shortest first, cut
    where a cut saves more than `forward_cost` padded tokens (None: the fewest micro-batches;
    `plan.padding`). Packed: in order, up to `token_budget` tokens each (a sample longer than the budget
    gets a micro-batch of its own)."""
    if token_budget is None:
        groups = length_groups(
            [sample_tokens(s) for s in samples], forward_cost, lambda rows, width, start: rows <= size
        )
        return [[samples[i] for i in group] for group in groups]
    return pack_in_order(samples, sample_tokens, token_budget)


def collate(
    samples: Sequence[TrainSample], loss: LossConfig, pad_id: int, *, packed: bool = False
) -> dict[str, torch.Tensor]:
    """The inputs plus, per response position, the row and index of the logit that predicts it: an index
    into `keep`, the sequence positions whose logits the model computes.

    Padded: one row per sample, right-padded. Packed: one row holding every sample end to end, with
    position ids restarting at 0 for each (no padding; each sample attends only to itself)."""
    lengths = [sample_tokens(s) for s in samples]
    targets = padded_targets(samples, loss)
    b, t_max = targets["teacher_mask"].shape
    l_max = max(lengths)
    rows = 1 if packed else b
    width = sum(lengths) if packed else l_max
    tokens = np.full((rows, width), pad_id, dtype=np.int64)
    attention = np.zeros((rows, width), dtype=np.int64)
    position_ids = np.zeros((rows, width), dtype=np.int64)
    row_of = np.zeros((b, 1), dtype=np.int64) if packed else np.arange(b)[:, None]
    positions = np.zeros((b, t_max), dtype=np.int64)
    response = np.zeros((b, t_max), dtype=np.int64)
    offset = 0
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        row, start = (0, offset) if packed else (i, 0)
        tokens[row, start : start + p] = s.prompt_ids
        tokens[row, start + p : start + p + r] = s.response_ids
        attention[row, start : start + p + r] = 1
        position_ids[row, start : start + p + r] = np.arange(p + r)
        positions[i, :r] = np.arange(start + p - 1, start + p + r - 1)
        offset += p + r
        response[i, :r] = s.response_ids
    # Only the positions that predict a response token need logits: the vocabulary projection of every
    # prompt position (a chat template's header, a long question) is most of a step's work at a real
    # vocabulary (152k). `keep` is their union over the rows, `positions` then index into it.
    counted = np.arange(t_max)[None, :] < np.array([len(s.response_ids) for s in samples])[:, None]
    # At least one position: a batch whose responses are all empty still runs the model (and its
    # collectives); its loss is masked to nothing.
    keep = np.unique(positions[counted]) if counted.any() else np.zeros(1, dtype=np.int64)
    positions = np.searchsorted(keep, positions)
    have_old = all(s.old_logprobs is not None for s in samples)
    batch = {
        "input_ids": torch.from_numpy(tokens),
        "attention_mask": torch.from_numpy(attention),
        "position_ids": torch.from_numpy(position_ids),
        "rows": torch.from_numpy(row_of),
        "keep": torch.from_numpy(keep),
        "positions": torch.from_numpy(positions),
        "response_ids": torch.from_numpy(response),
        "mask": counted_positions(targets, loss),
        "token_logprobs": torch.from_numpy(targets["token_logprobs"]),
        "topk_ids": torch.from_numpy(targets["topk_ids"]),
        "topk_logprobs": torch.from_numpy(targets["topk_logprobs"]),
        "advantages": torch.from_numpy(targets["advantages"]),
    }
    if have_old:
        batch["old_logprobs"] = torch.from_numpy(targets["old_logprobs"])
    return batch


class Trainer(TrainerWeightsAndState):
    """One data-parallel rank: the student model, its optimizer and schedule."""

    def __init__(
        self,
        model_dir: str | None,
        settings: TrainerSettings,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str | None = None,
        model: Any = None,
    ) -> None:
        """`model_dir`: the student in Hugging Face format; or `model`, a float32 causal LM built by the
        caller (on CPU or the meta device, for benchmarks), with `model_dir` None (no tokenizer)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.settings = settings
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.compute_dtype = resolve_precision(settings.precision, self.device)
        self.fsdp = settings.sharding == Sharding.FSDP
        torch.manual_seed(settings.seed)
        from_rank0 = False
        if model is None:
            assert model_dir is not None, "a model_dir or a model"
            if settings.sharded_load and self.fsdp and world_size > 1:
                from distillery_runtime.training.sharded_load import meta_model

                model = meta_model(model_dir)  # None: the checkpoint's names need from_pretrained
                from_rank0 = model is not None
            if model is None:
                # A LoRA student's frozen weights stay in the compute dtype: no float32 master, no gradient,
                # no AdamW state for them (the memory plan counts them so).
                frozen_dtype = self.compute_dtype if settings.lora is not None else torch.float32
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=frozen_dtype)
        self.logits_to_keep = "logits_to_keep" in inspect.signature(type(model).forward).parameters
        """The model computes logits at given positions only (every transformers causal LM of today; a
        remote-code model may not, and then gets every position's)."""
        self.lora = settings.lora
        if self.lora is not None:
            from distillery_runtime.training.lora import apply_lora

            model = apply_lora(model, self.lora)
        # A transformers causal LM, an FSDPModule too when sharded (typed loosely: the two are mixed in).
        self.model: Any
        if self.fsdp:
            from distillery_runtime.training.sharding import ensure_process_group, shard_student

            ensure_process_group(self.device, world_size)
            self.model = shard_student(
                model,
                device=self.device,
                compute_dtype=self.compute_dtype,
                cpu_offload=settings.cpu_offload,
                offload_pinned=settings.offload_pinned,
                activation_checkpointing=settings.activation_checkpointing,
                random_init=not from_rank0,
            )
            if from_rank0:
                from distillery_runtime.training.sharded_load import load_from_rank0

                load_from_rank0(self.model, model_dir)  # type: ignore[arg-type]
        else:
            if settings.activation_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.model = model.to(self.device)
        self.model.train()
        self.own_attention: str = self.model.config._attn_implementation
        """The attention kernel the model was loaded with (sdpa unless its config says otherwise); narrow
        micro-batches may train with eager instead (`plan.attention`)."""
        self.eager_attention_width = settings.eager_attention_width
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir) if model_dir is not None else None
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        self.pad_id = pad if pad is not None else 0
        self.optimizer = torch.optim.AdamW(
            # Only what trains: a LoRA student's adapter (its frozen weights get neither state nor updates).
            [p for p in self.model.parameters() if p.requires_grad],
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
            # foreach AdamW makes a whole-size temporary (4 bytes a parameter: measured, 1.5B peaked at 20
            # bytes a parameter on an H200, 7B ran out of memory): on a GPU the fused kernel has none;
            # offloaded, the step runs on the host, one tensor at a time.
            fused=True if self.device.type == "cuda" and not settings.cpu_offload else None,
            foreach=False if settings.cpu_offload else None,
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
        # FSDP2 computes in its MixedPrecisionPolicy's dtype; autocast is the replicated path's.
        enabled = self.compute_dtype != torch.float32 and not self.fsdp
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=enabled)

    def _use_attention(self, width: int) -> None:
        """The plan's attention kernel for a micro-batch `width` tokens a row wide (`plan.attention`); the
        backward, and the recompute of checkpointed layers in it, run before the next micro-batch sets it."""
        kernel = attention_kernel(width, self.eager_attention_width, self.own_attention)
        if kernel != self.model.config._attn_implementation:
            self.model.set_attn_implementation(kernel)
            if kernel != self.model.config._attn_implementation:
                # A model whose attention is not transformers' AttentionInterface cannot switch (transformers
                # warns): it keeps its own for the rest of the run.
                self.eager_attention_width = 0

    def _micro_batch_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float], int]:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        loss_cfg = self.settings.loss
        self._use_attention(batch["input_ids"].shape[1])
        with self._autocast():
            if self.settings.micro_batch_tokens is not None:
                # Packed: no attention mask; transformers reads the sample boundaries from position ids.
                inputs = {"position_ids": batch["position_ids"]}
            else:
                inputs = {"attention_mask": batch["attention_mask"]}
            # No KV cache in training: it costs memory, and transformers ignores packing when one is given.
            if self.logits_to_keep:
                inputs["logits_to_keep"] = batch["keep"]
            logits = self.model(input_ids=batch["input_ids"], use_cache=False, **inputs).logits
        positions = batch["positions"] if self.logits_to_keep else batch["keep"][batch["positions"]]
        # Logits of the positions that predict each response token: [B, T, V], by `index_select` of the
        # flattened rows. Advanced indexing (`logits[rows, positions]`) selects the same, but its backward
        # is an accumulating `index_put_`: in the profile of a 32-sample x 128-token step at a 1,031-token
        # vocabulary on the 2-core host, 22 ms against this backward's 9 ms; the gradient is the same.
        index = (batch["rows"] * logits.shape[1] + positions).reshape(-1)
        vocabulary = logits.shape[-1]
        student = (
            logits.reshape(-1, vocabulary).index_select(0, index).view(*positions.shape, vocabulary).float()
        )
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
        # This micro-batch's units of the step's reduction (its tokens, sequences, or 1 for sum), counted
        # by the function that counted the step's normaliser.
        share = int(reduction_units(out.mask.sum(-1), loss_cfg.reduction))
        return out.loss, out.metrics, share

    def train_step(self, samples: Sequence[TrainSample], normalizer: float) -> dict[str, float]:
        """One optimizer step on this rank's samples; `normalizer` is step_normalizer() of ALL ranks'."""
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        budget = self.settings.micro_batch_tokens
        batches = micro_batches(
            samples, self.settings.micro_batch_size, budget, self.settings.forward_cost_tokens
        )
        idle = self._micro_batch_count(len(batches)) - len(batches)
        weighted_sums: dict[str, float] = {}
        total_share = 0
        step_loss = 0.0
        for part in batches:
            batch = collate(part, self.settings.loss, self.pad_id, packed=budget is not None)
            loss, metrics, share = self._micro_batch_loss(batch)
            # sum: share 1 over normaliser 1, every micro-batch's whole loss.
            weight = share / normalizer
            (loss * weight).backward()
            step_loss += float(loss.detach()) * weight
            total_share += share
            for name, value in metrics.items():
                if name in MAX_METRICS:
                    weighted_sums[name] = max(weighted_sums.get(name, value), value)
                    continue
                add = value if name in COUNT_METRICS else value * share
                weighted_sums[name] = weighted_sums.get(name, 0.0) + add
        for _ in range(idle):
            self._idle_micro_batch()
        backward_done = time.perf_counter()
        if self.fsdp:
            grad_norm = self._clip_sharded()
        else:
            self._all_reduce_gradients()
            grad_norm = self._clip()
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.version += 1
        metrics = {
            name: value if name in COUNT_METRICS | MAX_METRICS else value / max(total_share, 1)
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
                # The step's parts (bench/e2e_vs_trl.py takes a step apart with them): collate, forward,
                # loss and backward of every micro-batch; then clipping and the optimizer step.
                "train/forward_backward_s": backward_done - started,
                "train/optimizer_s": time.perf_counter() - backward_done,
            }
        )
        return metrics

    def _micro_batch_count(self, mine: int) -> int:
        """FSDP2 ranks all-gather and reduce-scatter in every forward and backward, so every rank runs as
        many micro-batches as the busiest one (agreed before the first): the others run a one-token batch
        whose loss counts zero."""
        if not self.fsdp or self.world_size == 1:
            return mine
        most = torch.tensor([mine], device=self._collective_device())
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most)

    def _idle_micro_batch(self) -> None:
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
        (self.model(input_ids=ids, use_cache=False).logits.float().sum() * 0.0).backward()

    def _clip_sharded(self) -> float:
        from distillery_runtime.training.sharding import clip_sharded_gradients

        params = [p for p in self.model.parameters() if p.requires_grad]
        return clip_sharded_gradients(params, self.settings.grad_clip, self._collective_device())

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

    @torch.no_grad()
    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Log-prob of each response token under the current weights (for checks and tests)."""
        ids = torch.tensor([[*prompt_ids, *response_ids]], device=self.device)
        with self._autocast():
            logits = self.model(input_ids=ids).logits.float()
        p = len(prompt_ids)
        logp = torch.log_softmax(logits[0, p - 1 : -1], dim=-1)
        return logp.gather(-1, torch.tensor(response_ids, device=self.device)[:, None])[:, 0].tolist()
