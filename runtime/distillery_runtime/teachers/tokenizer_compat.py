"""Check, before training, that a teacher's tokenizer maps every token like the student's.

Top-k ids from a teacher index the student's vocabulary directly, so the two tokenizers must
agree on every token id. Vocabulary padding is allowed: model embedding tables may have more
rows than the tokenizer has tokens (Qwen2.5: 152064 vs 151936); only the tokenizers'
id -> token maps, their special tokens and the encoding of a few probe texts are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distillery_runtime.teachers.types import TokenizerMismatchError

DEFAULT_PROBES = (
    "Hello, world! 12+34=46",
    "  leading spaces\tand tabs\nnew lines",
    "ünïcødé 漢字 🙂",
)


def _id_to_token(tok: Any) -> dict[int, str]:
    return {i: t for t, i in tok.get_vocab().items()}


def tokenizer_differences(
    student_tok: Any, teacher_tok: Any, *, probes: Sequence[str] = DEFAULT_PROBES, limit: int = 5
) -> list[str]:
    """Human-readable differences (at most `limit` per kind), empty when compatible; pure."""
    s_map, t_map = _id_to_token(student_tok), _id_to_token(teacher_tok)
    diffs: list[str] = []
    differing = sorted(i for i in s_map.keys() | t_map.keys() if s_map.get(i) != t_map.get(i))
    for i in differing[:limit]:
        diffs.append(f"id {i}: student {s_map.get(i)!r} vs teacher {t_map.get(i)!r}")
    if len(differing) > limit:
        diffs.append(
            f"... {len(differing)} differing ids in total (student {len(s_map)}, teacher {len(t_map)} tokens)"
        )
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        a, b = getattr(student_tok, attr, None), getattr(teacher_tok, attr, None)
        if a is not None and b is not None and a != b:
            diffs.append(f"{attr}: student {a} vs teacher {b}")
    for text in probes:
        a = student_tok.encode(text, add_special_tokens=False)
        b = teacher_tok.encode(text, add_special_tokens=False)
        if a != b:
            diffs.append(f"encoding of {text!r}: student {a[:12]} vs teacher {b[:12]}")
            break
    return diffs


def probe_differences(
    student_tok: Any, teacher_encodings: Sequence[Sequence[int]], probes: Sequence[str]
) -> str | None:
    """The first probe text the student encodes differently from a teacher's server (its `/tokenize`
    answers, in `probes` order), as one line; None when they agree. Pure."""
    for text, theirs in zip(probes, teacher_encodings, strict=True):
        ours = student_tok.encode(text, add_special_tokens=False)
        if list(ours) != list(theirs):
            return f"probe {text!r}: student {list(ours)[:8]} vs teacher {list(theirs)[:8]}"
    return None


def check_tokenizer_compat(
    student_tok: Any,
    teacher_tok: Any,
    *,
    teacher_name: str = "teacher",
    probes: Sequence[str] = DEFAULT_PROBES,
) -> None:
    """Raise `TokenizerMismatchError` showing the first differing tokens; return None if compatible."""
    diffs = tokenizer_differences(student_tok, teacher_tok, probes=probes)
    if diffs:
        raise TokenizerMismatchError(
            f"{teacher_name}: tokenizer differs from the student's, so its top-k ids would not index the "
            "student's vocabulary (cross-tokenizer distillation is not supported):\n  " + "\n  ".join(diffs)
        )


async def served_encodings(
    base_url: str, model: str, probes: Sequence[str], timeout: float = 30.0
) -> list[list[int]] | None:
    """How a teacher's server encodes the probe texts, through vLLM's `POST /tokenize`; None when the
    server has no such endpoint (not every OpenAI-compatible server does)."""
    import aiohttp

    out: list[list[int]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for text in probes:
            body = {"model": model, "prompt": text, "add_special_tokens": False}
            async with session.post(base_url.rstrip("/") + "/tokenize", json=body) as response:
                if response.status in (404, 405):
                    return None
                response.raise_for_status()
                out.append(list((await response.json())["tokens"]))
    return out
