"""The per-token terms a loss is made of: sampled-token KL estimators, top-k divergences, the PPO-clipped
policy-gradient objective, and the chunked log-softmax gather they read the student's log-probs with."""
