"""Multi-turn, tool-using rollouts (`spec.environment`): the environments that answer the student's tool
calls (`environments.py`), how their observations become tokens (`observations.py`) and the episode runner
that plays a step's episodes turn by turn on the rollout engines (`episodes.py`)."""
