"""Where each of a job's processes runs: the GPU and placement-group bundle of every Ray actor (`gpus`) and
whether the rollout engine samples in a process of its own or in the trainer's (`rollout`).
"""
