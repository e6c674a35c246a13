"""Tiny locally-built models (tokenizer + Llama) for tests, benchmarks and synthetic tasks."""

from distillery_runtime.models.tiny import build_model, build_tokenizer, default_texts, save_tiny_model

__all__ = ["build_model", "build_tokenizer", "default_texts", "save_tiny_model"]
