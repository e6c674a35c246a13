"""What is checked once before step 1: the replicas of a served teacher agree on a probe, the job's demands
fit what its teachers serve, and every token the student can emit means the same to each teacher."""
