"""In-cluster runtime: the trainer, teacher clients and losses (torch, vLLM, Ray)."""
