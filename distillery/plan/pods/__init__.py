"""What each pod of a job (and of a shared teacher) is given: CPU, memory and `/dev/shm` (`resources`, from
the worker pod's `host_memory` plan, in Kubernetes `quantity` strings), where it is scheduled and what it
carries (`scheduling`), and the model cache mounted as `HF_HOME` (`model_cache`). The operator's renderers
translate them.
"""
