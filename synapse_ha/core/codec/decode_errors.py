"""The codec's errors: bytes that are not a valid encoding, and those of a newer release.

A replica refuses what it cannot read rather than guess; the replicated entry point turns
either error into an error result (:mod:`synapse_ha.core.codec.versioned` on rolling upgrades).
"""

from __future__ import annotations


class CodecError(ValueError):
    """Bytes that are not a valid encoding; the message names the field."""


class UnreadableFormat(CodecError):
    """A valid encoding of a newer release: a format version, a command type or a field
    this release does not know. The message says which and that this replica needs the
    upgrade."""
