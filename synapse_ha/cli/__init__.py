"""``synctl``, the command-line client: gRPC to the scheduler replicas and the workers'
log services, nothing else (it never imports the Raft or leader packages)."""
