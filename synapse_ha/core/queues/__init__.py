"""Queues: their order in a pass, quotas and borrowing, fair share, the cohort tree,
the rules a job obeys against them, and who may be preempted."""
