"""Distillery operator: reconciles DistillationJobs into KubeRay RayJobs, vLLM teachers and a truthful status."""
