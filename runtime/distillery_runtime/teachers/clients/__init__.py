"""The runtime's clients of served teachers: pooled HTTP to a teacher's replicas, the compact and the
OpenAI-compatible backends, samples coalesced into few requests, retries and the outage budget."""
