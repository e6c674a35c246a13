"""What the operator decides for one DistillationJob (pure): the writes to make (`decide`), the status
(`status`), which spec changes a running job accepts (`spec_changes`), whether its claims can be mounted
(`storage`), the trainer's identity (`identity`) and its shared teachers against the DistillationTeachers
they reference (`teacher_refs`).
"""
