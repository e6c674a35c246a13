"""The compact scoring protocol spoken by `POST /distillery/v1/score`.

Request: JSON (orjson), small: `{"top_k": K, "sequences": [{"id": str, "prompt_len": P,
"token_ids": [prompt + response ids]}, ...]}`.

Response (`application/x-distillery-scores`), little-endian, no per-entry encoding:

    header   16 bytes  magic b"DSC1", uint32 n_seqs, uint32 K, uint32 total_T
    lengths  int32[n_seqs]          response positions per sequence (sum = total_T)
    ids      int32[total_T * K]     top-k token ids, rank order, sequences concatenated
    logprobs float32[total_T * K]   their log-probs
    token    float32[total_T]       log-prob of the actual (student) token

Errors are JSON `{"error": {"message": ..., "type": ...}}` with an HTTP 4xx/5xx status.

Every request names the job it scores for in the `X-Distillery-Job` header (`namespace/name` in a
cluster, the job's name in a local run): a shared teacher serves jobs fairly and accounts for each
(`fair_share`, `job_serving`). A request without it (an external client) counts as job `unknown`. Where
the server knows its clients' keys (a shared teacher in a cluster), its key check replaces the header with
the job the key belongs to (`server_auth`): the header is then a claim nobody can make for another job.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

# Re-exported: the runtime's callers name the job the way the teachers' clients file does.
from distillery.plan.access.auth import job_identity as job_identity

MAGIC = b"DSC1"
MEDIA_TYPE = "application/x-distillery-scores"
SCORE_PATH = "/distillery/v1/score"
INFO_PATH = "/distillery/v1/info"
# The teacher's id -> token map, `{"tokens": [token or null, ...]}` indexed by id (tokenizer_compat).
VOCABULARY_PATH = "/distillery/v1/vocabulary"
_HEADER = struct.Struct("<4sIII")
JOB_HEADER = "X-Distillery-Job"
UNKNOWN_JOB = "unknown"
"""The job of a request without a (valid) job header: external clients share this one identity."""
# A namespace (DNS label) and a job name (DNS subdomain), or a local run's bare name; anything else is
# refused as an identity, since it becomes a metric label value.
_JOB = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,62}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def parse_job_header(value: str | None) -> str:
    """The job a request scores for: the header's value when it is a job identity, else `unknown`."""
    value = (value or "").strip()
    return value if _JOB.fullmatch(value) else UNKNOWN_JOB


@dataclass(frozen=True, slots=True)
class WireSequence:
    """One sequence to score: `token_ids` = prompt + response; positions >= prompt_len are returned."""

    token_ids: list[int]
    prompt_len: int
    seq_id: str = ""


def encode_request(sequences: Sequence[WireSequence], top_k: int) -> bytes:
    return orjson.dumps(
        {
            "top_k": top_k,
            "sequences": [
                {"id": s.seq_id, "prompt_len": s.prompt_len, "token_ids": list(s.token_ids)}
                for s in sequences
            ],
        }
    )


def decode_request(body: bytes) -> tuple[list[WireSequence], int]:
    """Parse a request body; raises ValueError with a readable message when malformed."""
    try:
        doc = orjson.loads(body)
        top_k = int(doc["top_k"])
        seqs = [
            WireSequence(list(s["token_ids"]), int(s["prompt_len"]), str(s.get("id", "")))
            for s in doc["sequences"]
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed scoring request: {exc!r}") from exc
    return seqs, top_k


def encode_response(
    lengths: np.ndarray,
    topk_ids: np.ndarray,
    topk_logprobs: np.ndarray,
    token_logprobs: np.ndarray,
    top_k: int,
) -> bytes:
    """Pack concatenated rows; the arrays are converted to little-endian int32/float32 if needed."""
    lengths = np.asarray(lengths, "<i4")
    total = int(lengths.sum())
    parts = [
        _HEADER.pack(MAGIC, len(lengths), top_k, total),
        lengths.tobytes(),
        np.ascontiguousarray(topk_ids, "<i4").tobytes(),
        np.ascontiguousarray(topk_logprobs, "<f4").tobytes(),
        np.ascontiguousarray(token_logprobs, "<f4").tobytes(),
    ]
    return b"".join(parts)


def decode_response(body: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Inverse of `encode_response`: (lengths, ids [total_T, K], logprobs [total_T, K], token [total_T], K).
    The arrays are zero-copy views of `body`."""
    if len(body) < _HEADER.size:
        raise ValueError(f"scoring response too short ({len(body)} bytes)")
    magic, n, k, total = _HEADER.unpack_from(body)
    if magic != MAGIC:
        raise ValueError(f"not a distillery scoring response (magic {magic!r})")
    expected = _HEADER.size + 4 * (n + 2 * total * k + total)
    if len(body) != expected:
        raise ValueError(f"scoring response is {len(body)} bytes, expected {expected} (truncated?)")
    off = _HEADER.size
    lengths = np.frombuffer(body, "<i4", n, off)
    off += 4 * n
    ids = np.frombuffer(body, "<i4", total * k, off).reshape(total, k)
    off += 4 * total * k
    lps = np.frombuffer(body, "<f4", total * k, off).reshape(total, k)
    off += 4 * total * k
    tok = np.frombuffer(body, "<f4", total, off)
    if int(lengths.sum()) != total:
        raise ValueError("scoring response lengths do not add up to its total")
    return lengths, ids, lps, tok, k


def error_body(message: str, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind}})
