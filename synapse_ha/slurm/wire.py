"""The step daemons' wire: newline-delimited JSON over TCP, opened by a mutual proof of
the job's step secret.

Every connection starts the same way, whoever opened it: each side sends
``{"nonce": N}``, then ``{"role": R, "token": T, "rank": K, "proof": P}`` where ``P``
is the HMAC-SHA256, under the job's secret (``$SYNAPSE_STEP_SECRET``, which only the
job's own processes hold), of both nonces (the sender's first), its role, the attempt's
fencing token and its rank. Each side checks the other's proof and token before it reads
anything else, so a process without the secret learns nothing and can ask nothing, a
process of another attempt (an older token) is turned away, and a process that took the
step port first is found out by the holders before they run what it asks.

Output travels base64-encoded (a program may write any bytes).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

MAX_LINE = 4 * 1024 * 1024  # a message: a task's environment, or an output chunk
HELLO_TIMEOUT_S = 10.0
SECRET_ENV = "SYNAPSE_STEP_SECRET"
HUB_ENV = "SYNAPSE_STEP_HUB"  # host:port of the first node's hub, for srun
STEP_PORT_OFFSET = 10_000  # the hub's port: the attempt's MASTER_PORT + this


class WireError(Exception):
    """The other side broke the protocol, failed its proof, or went away."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Who the other side proved to be."""

    role: str
    token: int
    rank: int


def step_port(master_port: int) -> int:
    """The hub's port for an attempt whose rank-0 member has ``master_port``: unique on
    its node among the cluster's jobs, as master ports are."""
    port = master_port + STEP_PORT_OFFSET
    if not 0 < port < 65_536:
        raise ValueError(f"MASTER_PORT {master_port} + {STEP_PORT_OFFSET} is not a port")
    return port


def _proof(secret: bytes, nonces: tuple[str, str], role: str, token: int, rank: int) -> str:
    text = f"{nonces[0]}|{nonces[1]}|{role}|{token}|{rank}".encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


class Channel:
    """One connection's reader and writer, with :meth:`send` and :meth:`receive`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            self.writer.write(line)
            await self.writer.drain()

    async def receive(self) -> dict[str, Any]:
        """The next message; raises :class:`WireError` at the end of the stream."""
        try:
            line = await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            raise WireError("the connection closed") from exc
        except asyncio.LimitOverrunError as exc:
            raise WireError("a message longer than the limit") from exc
        except OSError as exc:
            raise WireError(str(exc)) from exc
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise WireError("a message that is not JSON") from exc
        if not isinstance(message, dict):
            raise WireError("a message that is not a JSON object")
        return message

    async def hello(self, secret: bytes, role: str, token: int, rank: int) -> Peer:
        """The mutual proof (module docstring); the other side as it proved to be.
        Raises :class:`WireError` when its proof or its token is wrong."""
        mine = secrets.token_hex(16)
        await self.send({"nonce": mine})
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            theirs = str((await self.receive()).get("nonce", ""))
            await self.send(
                {
                    "role": role,
                    "token": token,
                    "rank": rank,
                    "proof": _proof(secret, (mine, theirs), role, token, rank),
                }
            )
            said = await self.receive()
        try:
            peer = Peer(str(said["role"]), int(said["token"]), int(said["rank"]))
            proof = str(said["proof"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError("a hello without role, token, rank and proof") from exc
        expected = _proof(secret, (theirs, mine), peer.role, peer.token, peer.rank)
        if not hmac.compare_digest(proof, expected):
            raise WireError("a wrong proof of the step secret")
        if peer.token != token:
            raise WireError(f"attempt token {peer.token}, not this attempt's {token}")
        return peer

    def close(self) -> None:
        self.writer.close()


async def connect(host: str, port: int) -> Channel:
    reader, writer = await asyncio.open_connection(host, port, limit=MAX_LINE)
    return Channel(reader, writer)


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def decode(text: str) -> bytes:
    return base64.b64decode(text)
