"""The student's side of a run: its rollout engines' settings and context (`settings`), how responses are
sampled and end (`generation`), how deep the engines on the student's GPUs sleep (`sleep`) and the teachers
the rollout engine scores itself (`student_base`). Carried out by `distillery_runtime.rollout`.
"""
