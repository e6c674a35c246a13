"""Supervised fine-tuning of a causal LM on (prompt, response) pairs: the preparation step's trainer.

Used to train the synthetic task's teacher and the student's weak start, and by the quality benchmark
as the off-policy baseline (SFT on teacher-generated answers). The loss covers the response tokens and
EOS only; prompts are context. A response is a text, or (the tools task's episodes) a sequence of
segments, each a text and whether the loss covers it: what a tool answered is context like the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE = -100

Segment = tuple[str, bool]
"""A piece of a response and whether the loss covers it (False: context, as a tool's observation is)."""
Response = str | Sequence[Segment]
"""A response: a text, all of it trained, or its segments (each tokenized on its own)."""


def encode_batch(
    tokenizer: PreTrainedTokenizerBase, pairs: Sequence[tuple[str, Response]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 outside response + EOS, and on a response's
    segments that are not trained)."""
    seqs, label_seqs = [], []
    # One call per side, not per pair: a task build encodes 64 pairs a step for 1,000+ steps.
    prompts = tokenizer([prompt for prompt, _ in pairs], add_special_tokens=False)["input_ids"]
    texts = [response for _, response in pairs if isinstance(response, str)]
    pieces = [text for _, response in pairs if not isinstance(response, str) for text, _ in response]
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    encoded_pieces = iter(tokenizer(pieces, add_special_tokens=False)["input_ids"] if pieces else [])
    for p, (_, response) in zip(prompts, pairs, strict=True):
        if isinstance(response, str):
            r = [*next(encoded), tokenizer.eos_token_id]
            seqs.append(p + r)
            label_seqs.append([IGNORE] * len(p) + r)
            continue
        tokens: list[int] = []
        targets: list[int] = []
        for _, trained in response:
            piece = next(encoded_pieces)
            tokens.extend(piece)
            targets.extend(piece if trained else [IGNORE] * len(piece))
        # EOS is trained: the model ends the episode
        seqs.append([*p, *tokens, tokenizer.eos_token_id])
        label_seqs.append([IGNORE] * len(p) + [*targets, tokenizer.eos_token_id])
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    labels = torch.tensor([s + [IGNORE] * (width - len(s)) for s in label_seqs])
    return ids, mask, labels


def sft_loss(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled positions."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )


def train_sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batches: Callable[[int], Sequence[tuple[str, Response]]],
    *,
    steps: int,
    lr: float,
    warmup: int = 50,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.98),
    min_lr_ratio: float = 0.0,
    on_step: Callable[[int, float], bool | None] | None = None,
    loss_fn: Callable[[PreTrainedModel, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = sft_loss,
) -> PreTrainedModel:
    """AdamW with linear warmup and cosine decay to `min_lr_ratio` x lr; `batches(step)` gives that step's pairs.

    `on_step(step, loss)` is called after each update (1-based step); returning True stops training
    early (the quality benchmark stops when a target accuracy is reached). `loss_fn(model, ids, mask,
    labels)` is the loss (`compact_vocab` trains a small stand-in of a large-vocabulary model with its own).
    """
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for step in range(steps):
        ids, mask, labels = encode_batch(tokenizer, batches(step))
        loss = loss_fn(model, ids, mask, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if on_step is not None and on_step(step + 1, loss.item()):
            break
    return model.eval()
