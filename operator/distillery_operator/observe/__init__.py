"""What the operator sees: small immutable summaries of the watched objects (`summaries`), whether a child
still holds what was rendered (`drift`), and the external teachers' health checks (`probes`).
"""
