"""The node agent behind ``synapse-worker``: discovery, heartbeats, self-fencing and the
supervised execution of gang members. It knows nothing of scheduling policy."""
