"""The operator's I/O with the Kubernetes API: the client every write goes through (`client`), leader
election on a Lease (`leader`), the keyed work queue (`workqueue`) and the poll of a starting job's pods'
scheduling (`scheduling`).
"""
