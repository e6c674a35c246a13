"""Everything about a job's teachers: their engine settings (`engines`, `scoring_engine`), when and by whom
each sample is scored (`routes`, `scoring_overlap`), how the job talks to a served one (`client`), whether
its replicas agree (`consistency`) and how many replicas a shared teacher runs (`scaling`). Carried out by
`distillery_runtime.teachers` and the operator's teacher handlers.
"""
