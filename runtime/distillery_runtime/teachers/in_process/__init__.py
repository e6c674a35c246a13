"""Teachers computed in the run's own processes: a colocated vLLM engine on the student's devices, the
transformers forward on the student's CPU cores, and the scoring of sequences by an in-process engine."""
