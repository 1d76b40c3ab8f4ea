"""Security shell: the cluster CA and certificates (:mod:`.pki`), the mutual-TLS gRPC
transport and the caller's identity (:mod:`.tls`), and signed log-access grants
(:mod:`.grants`). DESIGN §8.

It depends only on :mod:`synapse_ha.core.access`, ``grpc``, ``cryptography`` and the
standard library, so every process (replica, worker, synctl) can use it.
"""
