"""What a student's folder says about where its responses end: the `eos_token_id` of its
generation_config.json and of its config.json, read as they are (one id or a list), for the plan to join
with the tokenizer's (`distillery.plan.rollout.generation.end_token_ids`)."""

from __future__ import annotations

from pathlib import Path

import orjson

from distillery.plan.rollout.generation import EndTokens

FILES = ("generation_config.json", "config.json")
"""transformers generates with the first, and falls back to the second's ids when the first is absent."""


def declared_end_tokens(model_dir: str | Path) -> list[EndTokens]:
    """The `eos_token_id` of each file of `model_dir` that has one (a missing or unreadable file has
    none: the tokenizer's eos still ends responses)."""
    found: list[EndTokens] = []
    for name in FILES:
        path = Path(model_dir) / name
        try:
            config = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        value = config.get("eos_token_id") if isinstance(config, dict) else None
        if isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int) for v in value)):
            found.append(value)
    return found
