"""A run, end to end: the `distillery run` and `distillery serve-teacher` commands, what a laptop stands in for
a cluster with (embedded Ray, local teacher servers, the machine's GPUs), the Ray actors and their placement,
the start-up order, the head's preStop hook, and the loop (`run/loop/`) that drives every step. The top room:
it may use every other room, and none uses it."""
