"""Distillery: on-policy LLM distillation on Kubernetes. This package holds the API and the CLI."""

__version__ = "0.1.0"
