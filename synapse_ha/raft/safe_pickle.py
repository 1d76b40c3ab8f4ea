"""The check every log entry received from a peer passes before this replica keeps it.

pysyncobj stores a command as a pickle of protocol 2 (``pickle.dumps((funcID, args,
kwargs))`` for a replicated call, ``['add'|'rem', id, node]`` for a membership change,
the version for ``set_version``) and unpickles it when the entry is applied. Bytes from a
peer must therefore never hold a pickle that imports or calls anything but what those
commands need: :func:`pickle_problem` walks the opcodes and refuses ``INST``, ``OBJ``,
``NEWOBJ_EX``, the extension registry and persistent ids, and allows
``GLOBAL``/``STACK_GLOBAL`` only for :data:`ALLOWED_GLOBALS`: pysyncobj's node classes
(a membership command carries its node) and ``_codecs.encode`` (protocol 2 writes bytes
as ``_codecs.encode(text, 'latin1')``, one ``REDUCE``). It then loads the pickle with
stand-ins for those names: a node stand-in that takes only an address and whose class
refuses new attributes, and an encoder that takes only a string and ``latin1``. So the
one call a pickle can make is to encode a string or make a node from its address, and
what is checked is what pysyncobj reads.

:func:`message_problem` applies the check to a Raft message's entries, and
:func:`chunks_problem` to a large entry's joined chunks (see
:meth:`synapse_ha.raft.adapter.SafeSyncObj._join_transmission`). Both Raft transports
run it on every message before pysyncobj sees it.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any

# pysyncobj's command type of the no-op entry a new leader appends (one byte, no
# pickle; pysyncobj applies it without reading further), and the names its commands'
# pickles need.
_NO_OP = 1
ALLOWED_GLOBALS = frozenset(
    {("pysyncobj.node", "TCPNode"), ("pysyncobj.node", "Node"), ("_codecs", "encode")}
)
_CALLING = frozenset(
    {
        "INST",
        "OBJ",
        "NEWOBJ_EX",
        "EXT1",
        "EXT2",
        "EXT4",
        "PERSID",
        "BINPERSID",
    }
)
_NO_LOAD = "the pickle does not load"
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that imports or calls something it may not."""


class _StandInClass(type):
    def __setattr__(cls, name: str, value: Any) -> None:
        raise RefusedPickle(f"the pickle sets the attribute {name} of a class")


class _NodeStandIn(metaclass=_StandInClass):
    """What a node class stands for while a pickle is checked."""

    def __init__(self, *args: Any) -> None:
        if len(args) != 1 or type(args[0]) is not str:
            raise RefusedPickle("the pickle makes a node from other than its address")


def _latin1(text: Any, encoding: Any) -> bytes:
    """What ``_codecs.encode`` stands for while a pickle is checked."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise RefusedPickle("the pickle encodes other than a string to latin1")
    return text.encode("latin-1")


_STAND_INS: dict[tuple[str, str], Any] = {
    ("pysyncobj.node", "TCPNode"): _NodeStandIn,
    ("pysyncobj.node", "Node"): _NodeStandIn,
    ("_codecs", "encode"): _latin1,
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        stand_in = _STAND_INS.get((module, name))
        if stand_in is None:
            raise RefusedPickle(f"the pickle imports {module}.{name}")
        return stand_in

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("the pickle refers to a persistent id")


# The pickle of every replicated call of this project: pysyncobj's
# ``dumps((func_id, (envelope,), {}))`` at protocol 2, where the envelope is bytes. Byte
# for byte: the protocol, the function id (BININT1, BININT2 or BININT), then
# ``_codecs.encode(text, 'latin1')`` with the envelope as text, a 1-tuple of it, an empty
# dict, a 3-tuple, and STOP; the memo slots are always the same.
_CALL_HEAD = b"\x80\x02"
_CALL_ID = {ord("K"): 1, ord("M"): 2, ord("J"): 4}
_CALL_ENCODE = b"c_codecs\nencode\nq\x00X"
_CALL_TAIL = b"q\x01X\x06\x00\x00\x00latin1q\x02\x86q\x03Rq\x04\x85q\x05}q\x06\x87q\x07."


def is_replicated_call(data: bytes) -> bool:
    """Whether ``data`` is, byte for byte, the pickle of a replicated call with one bytes
    argument (:data:`_CALL_TAIL`'s shape): a pickle that, loaded, calls nothing but
    ``_codecs.encode`` of a string to latin1. The common case of :func:`pickle_problem`,
    recognised without walking the opcodes."""
    if not data.startswith(_CALL_HEAD) or len(data) < 3:
        return False
    width = _CALL_ID.get(data[2])
    if width is None:
        return False
    at = 3 + width
    if not data.startswith(_CALL_ENCODE, at):
        return False
    at += len(_CALL_ENCODE)
    size = int.from_bytes(data[at : at + 4], "little")
    start = at + 4
    end = start + size
    if len(data) != end + len(_CALL_TAIL) or not data.endswith(_CALL_TAIL):
        return False
    try:
        data[start:end].decode("utf-8").encode("latin-1")
    except UnicodeError:
        return False
    return True


def pickle_problem(data: bytes) -> str | None:
    """Why the pickle ``data`` may not be loaded (None: it may). A truncated or malformed
    pickle is a problem too."""
    if is_replicated_call(data):
        return None
    last: list[str] = []
    try:
        for opcode, arg, _pos in pickletools.genops(data):
            name = opcode.name
            if name in _CALLING:
                return f"the pickle holds the opcode {name}, which calls or imports"
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                if (module, attr) not in ALLOWED_GLOBALS:
                    return f"the pickle imports {module}.{attr}"
            elif name == "STACK_GLOBAL" and (
                len(last) < 2 or (last[-2], last[-1]) not in ALLOWED_GLOBALS
            ):
                return "the pickle imports a name built on its stack"
            if name in _STRINGS:
                last = [*last[-1:], str(arg)]
            elif name not in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                last = []
        _Restricted(io.BytesIO(data)).load()
    except RefusedPickle as exc:
        return str(exc)
    except Exception as exc:  # any failure to read is a refusal
        return f"{_NO_LOAD}: {type(exc).__name__}: {exc}"
    return None


def command_problem(command: Any) -> str | None:
    """Why a log entry's command (pysyncobj's type byte, then a pickle) may not be
    kept; None when it may."""
    if not isinstance(command, bytes):
        return f"a command is {type(command).__name__}, not bytes"
    if not command:
        return "a command is empty"
    if command[0] == _NO_OP:
        return None  # pysyncobj never reads past a no-op's type byte
    return pickle_problem(command[1:])


def entry_problem(entry: Any) -> str | None:
    """Why a log entry ``(command, index, term)`` may not be kept; None when it may."""
    if not isinstance(entry, tuple | list) or len(entry) != 3:
        return "a log entry is not (command, index, term)"
    _command, index, term = entry
    if type(index) is not int or type(term) is not int:
        return "a log entry's index or term is not an integer"
    return command_problem(entry[0])


def message_problem(message: Any) -> str | None:
    """Why a Raft message from a peer may not reach pysyncobj: one of its log entries
    (``entries`` of ``append_entries``) holds a command that fails :func:`command_problem`.
    A message that carries no entries passes; a chunk of a large entry is checked once
    joined."""
    if not isinstance(message, dict):
        return None
    entries = message.get("entries")
    if entries is None:
        return None
    if not isinstance(entries, list | tuple):
        return "the entries of a message are not a list"
    for entry in entries:
        problem = entry_problem(entry)
        if problem is not None:
            return problem
    return None


# chunks_problem's answer for chunks that are not a whole pickle yet.
TRUNCATED = "the chunks are not a whole pickle yet"


def chunks_problem(data: bytes) -> str | None:
    """Why the joined chunks of a large entry (a pickled ``(command, index, term)``) may
    not be loaded: :data:`TRUNCATED` when they are not a whole pickle yet (pysyncobj can
    mark a chunk last too early), None when they may be loaded."""
    if not data.endswith(b"."):  # pickle's STOP opcode
        return TRUNCATED
    problem = pickle_problem(data)
    if problem is not None:
        return TRUNCATED if problem.startswith(_NO_LOAD) else problem
    return entry_problem(pickle.loads(data))
