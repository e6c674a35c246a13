"""SFT of a large-vocabulary model on text that uses a few hundred of its tokens, at a small vocabulary's cost.

A Qwen-like model has 151,936 embedding rows, tied to its output layer; a tiny one (hidden 64) spends nearly
all of a CPU training step on the full softmax over them (measured: ~4 s a 32 x 32-position step on 2
cores), which would make a bundled task's preparation take most of an hour. But the rows a task's text never
uses are never an input, and under the full softmax each of them gets the same kind of gradient: away from
the hidden states, so that it is not predicted. So the preparation trains a compact stand-in: the same
network with a vocabulary of the used tokens plus one *shared* row for all the others, whose logit is raised
by log(number of unused rows). That softmax is exactly the full one of a model whose unused rows all equal
the shared row (their exp-sum is N exp(h . u)). `expand` writes the stand-in into an ordinary 151,936-row
model: each used row at its token id, the shared row everywhere else; what is evaluated and saved is that
model, and from then on (the distillation run) every row trains on its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from transformers import PreTrainedModel

from distillery_runtime.tasks.build.sft import IGNORE


@dataclass(frozen=True)
class CompactVocab:
    used: tuple[int, ...]
    """The full model's token ids the text uses (inputs, targets, padding), sorted; compact id = position."""
    full_size: int

    @classmethod
    def of(cls, ids: Iterable[int], full_size: int) -> CompactVocab:
        return cls(tuple(sorted(set(ids))), full_size)

    @property
    def shared(self) -> int:
        """The compact id of the row that stands for every unused token."""
        return len(self.used)

    @property
    def size(self) -> int:
        return len(self.used) + 1

    def lookup(self) -> torch.Tensor:
        """Full id -> compact id (-1 for an unused one)."""
        table = torch.full((self.full_size,), -1, dtype=torch.long)
        table[torch.tensor(self.used)] = torch.arange(len(self.used))
        return table

    def loss(self) -> _CompactLoss:
        """The SFT loss of the stand-in on full-vocabulary batches (`sft.train_sft`'s `loss_fn`)."""
        return _CompactLoss(self)

    def expand(self, compact: PreTrainedModel, full: PreTrainedModel) -> PreTrainedModel:
        """`full` (a fresh model of the same shape with `full_size` rows) given the stand-in's weights."""
        state = {
            k: v for k, v in compact.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k
        }
        missing, unexpected = full.load_state_dict(state, strict=False)
        assert not unexpected and all("embed_tokens" in k or "lm_head" in k for k in missing), missing
        rows = cast(torch.nn.Embedding, compact.get_input_embeddings()).weight.detach()
        with torch.no_grad():
            embedding = cast(
                torch.nn.Embedding, full.get_input_embeddings()
            ).weight  # the output layer too: tied
            embedding.copy_(rows[self.shared].to(embedding.dtype).expand_as(embedding))
            embedding[torch.tensor(self.used)] = rows[: self.shared].to(embedding.dtype)
        return full


class _CompactLoss:
    """Mean next-token cross-entropy of the stand-in over labelled positions, as the full model's would be."""

    def __init__(self, vocab: CompactVocab) -> None:
        self.vocab = vocab
        self.table = vocab.lookup()
        self.log_unused = math.log(vocab.full_size - len(vocab.used))

    def __call__(
        self, model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        compact_ids = self.table[ids]
        if bool((compact_ids < 0).any()):
            unknown = sorted(set(ids[compact_ids < 0].tolist()))[:5]
            raise ValueError(
                f"token ids {unknown} are not in the compact vocabulary; build it from all the text"
            )
        compact_labels = torch.where(labels == IGNORE, IGNORE, self.table[labels.clamp(min=0)])
        logits = model(input_ids=compact_ids, attention_mask=mask).logits[:, :-1].float()
        offset = torch.zeros(self.vocab.size)
        offset[self.vocab.shared] = self.log_unused
        return torch.nn.functional.cross_entropy(
            (logits + offset).reshape(-1, self.vocab.size),
            compact_labels[:, 1:].reshape(-1),
            ignore_index=IGNORE,
        )
