"""A tool-using student's episodes (`spec.environment`): where a turn ends with a call, how long an episode
may grow and a response may be. Carried out by `distillery_runtime.agents`.
"""
