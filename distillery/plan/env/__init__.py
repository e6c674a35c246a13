"""The environment variables of the processes a run starts: glibc's heap (`heap`), OpenMP's threads
(`threads`) and every vLLM engine's own settings (`vllm`).
"""
