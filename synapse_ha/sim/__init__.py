"""Trace-driven simulation: replay a workload through the real ``schedule`` and ``apply``
with a simulated clock, and compare scheduling policies on it."""
