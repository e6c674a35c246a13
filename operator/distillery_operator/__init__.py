"""Distillery operator: reconciles DistillationJobs into KubeRay RayJobs, vLLM teachers and a truthful status.

Its rooms, bottom first (`tests/test_layering.py`, `OPERATOR_ROOMS`): `render` (the objects the operator
owns, pure), `observe` (what the watches and probes see), `jobs` (what one job's writes and status are,
pure), `k8s` (the API client, leader election, the work queue), `reconcile` (the jobs' loop, the only part
that acts) and `teachers` (the DistillationTeachers' decisions and loop). At the top: `main` (the process),
`handlers` (kopf's registrations), and `naming` and `metrics`, which every room uses, with `serving` (the
operator's own HTTP endpoints).
"""
