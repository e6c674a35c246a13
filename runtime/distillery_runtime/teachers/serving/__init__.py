"""The teacher server's parts around its engine (`teachers/server.py` is the process): the key check, fair
admission of many jobs, per-job busy time and metrics, and the exact top-k of vLLM's log-prob gathering."""
