"""The student's training: the per-rank `Trainer` (micro-batches, loss, backward, clip, AdamW), FSDP2
sharding, the sharded load of the student, and the learning-rate schedule. Uses `checkpoints/` to save and
resume, `losses/` for the loss and `sync/` to send its weights to the rollout engines."""
