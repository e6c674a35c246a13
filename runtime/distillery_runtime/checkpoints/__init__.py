"""What a run keeps on disk: checkpoints written atomically and found reliably, the exported model, the
streamed export from the trainer's shards, and the safe reader of the optimizer's shards."""
