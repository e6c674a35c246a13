"""The jobs' reconcile loop, the only part that acts on what `jobs` decides: what the watches deliver
(`inputs`) and the workers that decide and write (`controller`).
"""
