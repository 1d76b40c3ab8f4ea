"""Raft wiring over pysyncobj: the only package that imports it."""
