"""Build tiny causal LMs from scratch, locally, for tests and benchmarks (not for jobs: the bundled
synthetic task builds its own models, tasks/build/prepare.py).

No model hub is reachable where Distillery is developed and tested, so every model used by
the test suite is made here: a byte-level BPE tokenizer trained with `tokenizers` on the
caller's texts, wrapped in `PreTrainedTokenizerFast` (pad/bos/eos and a minimal chat
template), and a randomly initialised transformers `LlamaConfig` model. The saved
directory loads in both transformers and vLLM.

Callers with their own task (for example an arithmetic task over digits, '+', '=' and
spaces) pass their own `texts` and `vocab_size`; `full_byte_alphabet=False` keeps the
vocabulary down to the characters actually present in `texts` (plus `<unk>`).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"

# Jinja template in the ChatML style, kept short: tests only need something that renders.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def default_texts(n: int = 2000, seed: int = 0) -> list[str]:
    """A small synthetic corpus (English-ish words, digits, arithmetic) for a general tokenizer."""
    g = torch.Generator().manual_seed(seed)
    words = [
        *[
            "the",
            "a",
            "teacher",
            "student",
            "model",
            "token",
            "score",
            "learn",
            "distill",
            "kernel",
            "cluster",
            "pod",
            "node",
            "run",
        ],
        *[
            "train",
            "step",
            "loss",
            "value",
            "answer",
            "question",
            "what",
            "is",
            "of",
            "to",
            "and",
            "in",
            "on",
            "for",
            "with",
        ],
    ]
    out: list[str] = []
    for i in range(n):
        k = int(torch.randint(3, 12, (1,), generator=g))
        idx = torch.randint(0, len(words), (k,), generator=g).tolist()
        a, b = torch.randint(0, 1000, (2,), generator=g).tolist()
        out.append(" ".join(words[j] for j in idx) + f" {a}+{b}={a + b}" + ("." if i % 2 else "?"))
    out.append(string.printable)
    return out


def build_tokenizer(
    texts: Iterable[str] | None = None,
    vocab_size: int = 1024,
    *,
    full_byte_alphabet: bool = True,
    model_max_length: int = 2048,
    chat_template: str | None = CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and wrap it for transformers and vLLM.

    `vocab_size` counts special tokens. With `full_byte_alphabet` (default) every byte has a
    token, so any text encodes; without it the alphabet is what `texts` contain and the rest
    maps to `<unk>`, which allows vocabularies smaller than 256. `chat_template=None` makes a base
    model's tokenizer: data.chatTemplate auto then uses prompt text as it is.
    """
    texts = list(texts) if texts is not None else default_texts()
    specials = [PAD, BOS, EOS, UNK]
    tok = Tokenizer(models.BPE(unk_token=None if full_byte_alphabet else UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if full_byte_alphabet else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    vocab_size: int | None = None,
    max_position_embeddings: int = 2048,
    init_std: float = 0.1,
) -> LlamaForCausalLM:
    """A randomly initialised Llama sized for CPU tests.

    `vocab_size` (embedding rows) defaults to the tokenizer's length; pass a larger value to
    mimic vocab padding. `init_std` 0.1 (transformers uses 0.02) makes next-token
    distributions distinct across positions: a one-position misalignment moves log-probs by
    ~1 nat, far above the ~0.1 nat bf16 rounding error, so alignment bugs cannot hide.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # transformers wraps `to` in a decorator whose type mypy reads as taking the model first.
    return model.to(dtype).eval()  # type: ignore[arg-type]


def save_tiny_model(
    directory: str | Path,
    *,
    texts: Sequence[str] | None = None,
    vocab_size: int = 1024,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    tokenizer: PreTrainedTokenizerFast | None = None,
    full_byte_alphabet: bool = True,
    model_vocab_size: int | None = None,
    init_std: float = 0.1,
) -> Path:
    """Build a tokenizer (unless given) and a model, and save both to `directory`.

    Returns the directory. Pass `tokenizer` to give several models (a student and its
    teachers) the same tokenizer; `seed` makes the weights differ.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = tokenizer or build_tokenizer(texts, vocab_size, full_byte_alphabet=full_byte_alphabet)
    model = build_model(
        tok,
        hidden=hidden,
        layers=layers,
        heads=heads,
        seed=seed,
        dtype=dtype,
        vocab_size=model_vocab_size,
        init_std=init_std,
    )
    model.save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return directory
