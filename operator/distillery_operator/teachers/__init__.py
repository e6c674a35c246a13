"""The DistillationTeachers: what the operator does with one (`decide`, pure), its replicas' load read from
their /metrics (`metrics`) and the loop that reads, decides and writes (`loop`).
"""
