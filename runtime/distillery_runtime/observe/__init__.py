"""What a run tells the outside: the Prometheus metrics and `metrics.jsonl`, the DistillationJob's status, the
end-of-run report, and the statistics of a step's responses. Reads the records of a step; drives nothing."""
