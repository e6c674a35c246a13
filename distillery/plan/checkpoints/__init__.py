"""What a job keeps and where: the storage its checkpoints live on in a cluster (`storage`) and what each
checkpoint's model folder is made of (`export`). Carried out by `distillery_runtime.checkpoints`.
"""
