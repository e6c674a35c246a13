"""The chat-math task's recipe and what it builds on: Qwen-like tokenizers and tiny models from Qwen's real
BPE ranks (with their chat templates), and SFT of a large-vocabulary model over a compact vocabulary."""
