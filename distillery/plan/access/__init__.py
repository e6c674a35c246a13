"""Who may reach a job's endpoints: Ray's token authentication and the teachers' API key (`auth`), and
which pods may open a connection to which (`network`, the flows the operator's NetworkPolicies are made of).
"""
