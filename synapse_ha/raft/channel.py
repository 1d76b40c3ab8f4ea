"""The Raft channel's guard: which channel a replica runs (:func:`raft_channel`), the
password rule, the key bound to the security mode, and the security mode a data
directory remembers.

A secure replica talks Raft over mutual TLS with its replica certificate by default
(:mod:`synapse_ha.raft.tls_transport`: no password, no pickle on the wire);
``raft.transport = "password"`` keeps pysyncobj's channel, which a cluster of replicas of
an earlier release speaks, and which an insecure replica always runs. On that channel,
pysyncobj encrypts and authenticates every Raft message with a key derived from the Raft
password, and unpickles what decrypts: whoever holds the key can run code on every
replica. So the password must be a real key (:func:`raft_password_problem`,
:data:`PASSWORD_RULE`), and the key is bound to the replica's security mode
(:func:`raft_key`): a replica started ``--insecure`` with the cluster's password shares
no key with the secure replicas, so it can neither join their Raft nor receive a byte of
their state (and both sides log why, see :mod:`synapse_ha.raft.adapter`). A data
directory remembers the mode that wrote it (:func:`data_dir_mode_problem`): the state of
a secure cluster is never served by a replica started ``--insecure`` on it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re

MIN_PASSWORD_BYTES = 32
# 32 random bytes hold about 30 distinct values; fewer than 16 is a pattern, not a key.
MIN_DISTINCT_BYTES = 16
PASSWORD_RULE = (
    f"a Raft password is at least {MIN_PASSWORD_BYTES} random bytes written in base64 "
    "(standard or URL-safe, padding optional) or in hex, and those bytes take at least "
    f"{MIN_DISTINCT_BYTES} distinct values; make one with `openssl rand -base64 32`"
)
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/_-]+={0,2}$")
# The key of an insecure replica is derived under this label (see raft_key).
_INSECURE_KEY_LABEL = b"synapse raft channel v1: a replica started --insecure"
MODE_FILE = "raft.mode"
SECURE, INSECURE = "secure", "insecure"
# The Raft channels (raft.transport): mutual TLS with the replica certificates
# (synapse_ha.raft.tls_transport), or pysyncobj's channel under the Raft password.
TLS_CHANNEL, PASSWORD_CHANNEL = "tls", "password"
RAFT_CHANNELS = (TLS_CHANNEL, PASSWORD_CHANNEL)


def raft_channel(value: str, secure: bool) -> str:
    """The Raft channel of a replica whose setting is ``value`` ("" when not given):
    :data:`TLS_CHANNEL` by default for a secure replica, :data:`PASSWORD_CHANNEL` for an
    insecure one (the only one it can run). ``ValueError`` names the rule otherwise."""
    if value and value not in RAFT_CHANNELS:
        raise ValueError(f"raft.transport must be one of {', '.join(RAFT_CHANNELS)}, got {value!r}")
    if not secure:
        if value == TLS_CHANNEL:
            raise ValueError(
                "raft.transport = tls needs the replica's TLS files; a replica started "
                "--insecure talks Raft over the password channel"
            )
        return PASSWORD_CHANNEL
    return value or TLS_CHANNEL


def raft_password_problem(password: str) -> str | None:
    """Why ``password`` may not guard the Raft channel, ending with :data:`PASSWORD_RULE`;
    None when it may.

    The rule, as checked: the text is hex (an even number of hex digits) or base64
    (either alphabet, padding optional; line breaks and spaces, as ``openssl rand
    -base64`` puts in long output, are skipped); decoded, it is at least
    :data:`MIN_PASSWORD_BYTES` bytes with at least :data:`MIN_DISTINCT_BYTES` distinct
    byte values. A text of hex digits only is read as hex. Entropy cannot be measured
    from one sample: this refuses short and patterned passwords, and the rule asks for
    random bytes."""
    decoded = _decode_password(password)
    if decoded is None:
        why = "it is neither base64 nor hex"
    elif len(decoded) < MIN_PASSWORD_BYTES:
        why = f"it holds {len(decoded)} bytes"
    elif len(set(decoded)) < MIN_DISTINCT_BYTES:
        why = f"its {len(decoded)} bytes take only {len(set(decoded))} distinct values"
    else:
        return None
    return f"the Raft password is too weak ({why}): {PASSWORD_RULE}"


def _decode_password(text: str) -> bytes | None:
    password = "".join(text.split())
    if _HEX.match(password):
        return bytes.fromhex(password) if len(password) % 2 == 0 else None
    if not _BASE64.match(password):
        return None
    body = password.rstrip("=")
    if ("+" in body or "/" in body) and ("-" in body or "_" in body):
        return None  # two alphabets at once
    try:
        return base64.b64decode(
            body.replace("-", "+").replace("_", "/") + "=" * (-len(body) % 4), validate=True
        )
    except (binascii.Error, ValueError):
        return None


def raft_key(password: str, secure: bool) -> str:
    """What pysyncobj derives the Raft channel key from, for a replica in this mode.

    A secure replica uses the password itself (the key of a secure cluster is what it
    was, so a rolling upgrade keeps its replicas talking); an insecure one uses an HMAC
    of the password under a fixed label. The two keys differ whatever the password, so
    replicas of different modes cannot exchange a single message."""
    if secure:
        return password
    digest = hmac.new(password.encode(), _INSECURE_KEY_LABEL, hashlib.sha256).hexdigest()
    return f"{INSECURE}:{digest}"


def data_dir_mode_problem(data_dir: str, secure: bool) -> str | None:
    """Why a replica in this mode may not start on ``data_dir`` (None when it may): the
    directory holds the state of a secure cluster (its :data:`MODE_FILE` says so) and
    the replica is insecure, so it would serve that state, tokens included, to anyone.
    The other way (an insecure cluster turned secure) is allowed."""
    try:
        with open(os.path.join(data_dir, MODE_FILE), encoding="utf-8") as f:
            recorded = f.read().strip()
    except FileNotFoundError:
        return None
    if secure or recorded != SECURE:
        return None
    return (
        f"{data_dir} holds the state of a secure cluster ({MODE_FILE}: {SECURE}); a "
        "replica started --insecure would serve it, tokens included, to anyone who can "
        "reach its port: start it with TLS, or on an empty data directory"
    )


def record_mode(data_dir: str, secure: bool) -> None:
    """Write this replica's mode into ``data_dir`` (atomically) unless it is there."""
    path = os.path.join(data_dir, MODE_FILE)
    mode = SECURE if secure else INSECURE
    try:
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == mode:
                return
    except FileNotFoundError:
        pass
    staged = f"{path}.new"
    with open(staged, "w", encoding="utf-8") as f:
        f.write(mode + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)
