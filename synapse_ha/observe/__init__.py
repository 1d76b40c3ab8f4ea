"""Observability adapters: Prometheus metrics of replicas and workers, the HTTP(S) server
that serves them, and the replicas' web dashboard."""
