"""Weight sync: the trainer's weights streamed in buckets to every rollout engine over a process group of
their own. A leaf room: the trainer sends through it, the rollout engines receive through it."""
