"""The password channel's Raft transport (``raft.transport = password``, and every
``--insecure`` replica): pysyncobj's TCP transport, which says why a peer cannot be read.

pysyncobj encrypts every Raft message with a key derived from the password (Fernet) and
drops a connection whose message does not decrypt, silently: two replicas whose keys
differ (another password, or the other security mode, see
:func:`synapse_ha.raft.channel.raft_key`) never exchange a message, and neither says
why. :class:`~synapse_ha.raft.adapter.KeyCheckingTransport` keeps pysyncobj's transport
and adds the reason to the log: the replica that receives a message it cannot decrypt
names the peer and the cause; the replica whose connection is closed before the key
exchange finished names the peer too. Each peer is named at most once per
:data:`PEER_NOTICE_INTERVAL_S`.

A peer on the TLS channel (:mod:`synapse_ha.raft.tls_transport`) that connects to a
replica of the password channel opens with a TLS handshake record, which pysyncobj would
read as the length of a message it then waits for until the peer gives up. The transport
recognises the record on an accepted connection, names the peer and the cause in the
same way, and closes the connection at once.

:class:`PasswordChannelWatch` holds the checks; the transport itself, which hooks into
pysyncobj's private connection events, is the adapter's ``KeyCheckingTransport``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cryptography.fernet import InvalidToken
from pysyncobj.monotonic import monotonic as raft_clock

from synapse_ha.raft.safe_pickle import message_problem

log_ = logging.getLogger(__name__)

# A peer that cannot talk (its key differs, it is refused) retries every
# connection_retry_s; it is named this seldom.
PEER_NOTICE_INTERVAL_S = 30.0


class PeerThrottle:
    """Lets a notice about a Raft peer through at most once per peer and cause per
    ``interval_s``; ``reports`` counts every occurrence (let through or not). Safe from
    any thread."""

    def __init__(
        self,
        interval_s: float = PEER_NOTICE_INTERVAL_S,
        clock: Callable[[], float] = raft_clock,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self.reports = 0
        self._last: dict[tuple[str, str], float] = {}

    def due(self, peer: str, cause: str) -> bool:
        """Count one occurrence; whether to say it (the first for ``peer`` and ``cause``
        in ``interval_s``)."""
        with self._lock:
            self.reports += 1
            now = self._clock()
            last = self._last.get((peer, cause))
            if last is not None and now - last < self.interval_s:
                return False
            self._last[(peer, cause)] = now
            return True


class KeyMismatchLog(PeerThrottle):
    """Says, at most once per peer and cause per ``interval_s``, that a Raft peer does
    not share this replica's key. ``mode`` names this replica's security mode in the
    sentence (when known)."""

    def __init__(self, mode: str | None, **throttle: Any) -> None:
        super().__init__(**throttle)
        self.mode = mode

    def undecryptable(self, peer: str) -> None:
        self._say(
            peer,
            "sent a message this replica cannot decrypt",
            "nothing it sends is read",
        )

    def closed_during_key_exchange(self, peer: str) -> None:
        self._say(
            peer,
            "closed the connection before the key exchange finished",
            "it could not decrypt this replica's first message",
        )

    def speaks_tls(self, peer: str) -> None:
        self._say(
            peer,
            "opened a TLS handshake",
            "it runs raft.transport = tls; the connection is closed",
        )

    def _say(self, peer: str, what: str, consequence: str) -> None:
        if not self.due(peer, what):
            return
        log_.warning(
            "Raft peer %s %s (%s): it does not share this replica's Raft key. Replicas of "
            "one cluster need the same Raft password, the same security mode and the same "
            "raft.transport%s",
            peer,
            what,
            consequence,
            f"; this replica runs {self.mode}" if self.mode else "",
        )


class _CheckedKey:
    """pysyncobj's Fernet for one connection, reporting messages that do not decrypt
    (pysyncobj then drops the connection, as before)."""

    def __init__(self, fernet: Any, peer: str, mismatches: KeyMismatchLog) -> None:
        self._fernet = fernet
        self._peer = peer
        self._mismatches = mismatches

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        encrypted: bytes = self._fernet.encrypt_at_time(data, current_time)
        return encrypted

    def extract_timestamp(self, token: bytes) -> int:
        timestamp: int = self._checked(self._fernet.extract_timestamp, token)
        return timestamp

    def decrypt(self, token: bytes) -> bytes:
        data: bytes = self._checked(self._fernet.decrypt, token)
        return data

    def _checked(self, read: Callable[[bytes], Any], token: bytes) -> Any:
        """``read(token)``; a token that does not decrypt is reported, then raised."""
        try:
            return read(token)
        except InvalidToken:
            self._mismatches.undecryptable(self._peer)
            raise


# The first two bytes of a TLS handshake record: content type 22, major version 3.
TLS_HANDSHAKE_RECORD = b"\x16\x03"


class PasswordChannelWatch:
    """What the password channel's transport
    (:class:`~synapse_ha.raft.adapter.KeyCheckingTransport`) reports about its
    connections, and the reasons it logs (module docstring). ``mode`` names this
    replica's security mode in the sentence (None: not named)."""

    def __init__(self, mode: str | None) -> None:
        self.key_mismatches = KeyMismatchLog(mode)
        self._exchanging: set[int] = set()  # ids of outgoing connections mid key exchange

    def outgoing_added(self, conn: Any, address: str) -> None:
        """A connection to the member ``address`` was made (not yet opened)."""
        if conn.encryptor is not None:
            conn.encryptor = _CheckedKey(conn.encryptor, address, self.key_mismatches)

    def incoming(self, conn: Any, host: str) -> Callable[[bytes], bool] | None:
        """A connection from ``host`` ("" when unknown) was accepted; what judges its
        first bytes (True: refuse the connection), None when it is not encrypted.

        The host alone names the peer: the port is an ephemeral one, new at every retry,
        and which member it is arrives only in a message that must decrypt first (the
        host keeps the log to one line per host). A TLS handshake record is reported and
        refused; the first message of the password channel is a short key exchange,
        whose 4-byte length never starts so."""
        if conn.encryptor is None:
            return None
        peer = f"at {host} (incoming)" if host else "(an incoming connection)"
        conn.encryptor = _CheckedKey(conn.encryptor, peer, self.key_mismatches)

        def refuses(start: bytes) -> bool:
            if start != TLS_HANDSHAKE_RECORD:
                return False
            self.key_mismatches.speaks_tls(peer)
            return True

        return refuses

    def outgoing_connecting(self, conn: Any) -> None:
        if conn.encryptor is not None:
            self._exchanging.add(id(conn))

    def outgoing_answered(self, conn: Any) -> None:
        self._exchanging.discard(id(conn))

    def accepts(self, node: Any, message: Any) -> bool:
        """Whether ``message`` from ``node`` goes on to pysyncobj (else it is logged)."""
        problem = message_problem(message)
        if problem is None:
            return True
        log_.warning("Raft message from %s refused: %s", getattr(node, "address", node), problem)
        return False

    def disconnected(self, conn: Any, address: str | None) -> None:
        """A connection (to or from the member ``address``, None: unknown) closed."""
        if id(conn) in self._exchanging:
            self._exchanging.discard(id(conn))
            self.key_mismatches.closed_during_key_exchange(
                address if address is not None else "(unknown)"
            )
