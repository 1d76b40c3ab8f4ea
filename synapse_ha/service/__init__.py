"""The replica's use cases, transport-free: one function per use case (a heartbeat, a
submission, a cancellation, a node's registration), each returning its typed result or
one :class:`~synapse_ha.service.refusal.Refusal`.

The transports (the unary servicers of :mod:`synapse_ha.rpc.server`, the heartbeat
streams of :mod:`synapse_ha.rpc.stream`, the relayed batches of
:mod:`synapse_ha.rpc.relay`) convert their messages, call a use case and map a refusal
to their wire error in one place (:func:`synapse_ha.rpc.errors.refusal_status`). What a
use case needs from the replica is :class:`~synapse_ha.service.replica.Replica`.
No gRPC and no protobuf here (an import-linter contract keeps them out).
"""
