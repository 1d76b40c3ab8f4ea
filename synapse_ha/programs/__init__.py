"""Composition roots: the synapse-scheduler and synapse-worker programs."""
