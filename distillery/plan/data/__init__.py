"""How a job's rows become the trainer's and the teachers' inputs: the prompts (`prompts`) and how samples
are grouped into padded forwards (`padding`). Carried out by `distillery_runtime.data`.
"""
