"""Security shell: the cluster CA and certificates (:mod:`.pki`), the mutual-TLS gRPC
transport and the caller's identity (:mod:`.tls`), and signed log-access grants
(:mod:`.grants`). DESIGN §8.

It depends only on :mod:`synapse_ha.core.identity.access`, ``grpc``, ``cryptography`` and the
standard library (an import-linter contract holds it to that), so every process
(replica, worker, synctl) can use it.

How a process uses it::

    files = TlsFiles(ca=Path("ca.pem"), cert=Path("replica-r1.pem"), key=Path("replica-r1.key"))
    transport = Transport(files)            # or Transport.insecure() behind --insecure
    port = transport.add_port(server, "0.0.0.0:7101")   # mutual TLS, reloads changed files
    channel = transport.channel("10.0.0.2:7102")        # to a replica; rebuild when
                                                        # transport.version() changes
    logs = transport.channel("10.0.1.7:7070", worker="gpu-7")   # to that worker only

    # in a handler: who is calling (None on plaintext)
    caller = peer_identity(context)

    # a replica lets a user read a job's logs on a worker for five minutes
    grant = sign_grant(GrantClaims(job_id, str(caller), now_s + 300, node_id),
                       key_pem=material.key, cert_pem=material.cert)
    # the worker: add_worker_service(server, root, on_nudge, LogAccess.for_transport(t, node_id))
"""
