"""The chaos suite: real faults against a real cluster, and a checker over the history.

Every replica, worker and the client run in network namespaces of their own, joined by a
bridge; partitions are nftables rules, crashes are ``kill -9`` and pauses ``SIGSTOP``. Gang
members append to an execution ledger and perform their effect at a fencing-aware sink;
:mod:`chaos.checker` then proves from the saved history that no job ran twice at once,
nothing acknowledged was lost and the replicas converged.

Run ``python -m chaos --help``.
"""

# gRPC without its fork handlers before anything imports it: the orchestrator forks
# commands while its gRPC threads run (see synapse_ha.programs).
import synapse_ha.programs  # noqa: F401
