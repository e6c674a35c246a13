"""What the student's GPUs hold: the per-GPU memory plan (`gpu`), the engines' shares of a GPU (`budget`),
the memory features the plan turns on (`features`: sharding, activation checkpointing, CPU offload) and
`distillery plan`'s lines on a LoRA student's memory (`lora_report`).
"""
