"""The on-policy distillation loop and its pure decisions (`plan.py`): one step's phases (rollout, scoring,
training, sync, evaluation, checkpoint) on the run's Ray actors."""
