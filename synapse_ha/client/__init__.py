"""The client library of a synapse cluster: :class:`~synapse_ha.client.cluster.ClusterClient`
finds the leader among the replicas, follows redirects and retries, and is what synctl,
workers, the local launcher, the chaos suite and the benchmarks call the cluster with."""
