"""Running the system on one machine: the local dev cluster and the narrated demo."""
