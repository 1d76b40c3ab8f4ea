"""Versioned, canonical encoding of commands and of the whole state.

The encoding is JSON with sorted keys and no insignificant whitespace, built from the
dataclasses' type hints: no pickling of arbitrary objects, and the same value always
gives the same bytes, so replicas and snapshots can be compared byte for byte.
``decode(encode(x)) == x`` holds for every command and state.

This module is the envelope (format version, command type) and the entry points; the
values inside are written by :mod:`synapse_ha.core.codec.to_plain` and read back by
:mod:`synapse_ha.core.codec.from_plain`, version 1 layouts through
:mod:`synapse_ha.core.codec.v1`. Decoding checks every field's type against the dataclass
and raises :class:`~synapse_ha.core.codec.decode_errors.CodecError` naming the path of the
offending field; nothing malformed reaches ``apply``.

Format versions and rolling upgrades. Commands and the state carry a format version
(``"v"``). A replica reads every version in ``READABLE_VERSIONS`` and writes the newest.
What it cannot read — a newer version, a command type it does not know, a field it does
not know (written by a newer release) — it refuses with ``UnreadableFormat``
(:mod:`synapse_ha.core.codec.decode_errors`), and the replicated entry point turns that into an
error result (never an exception: that would wedge the log). Such a replica then lacks
that change while the others have it, so the rule for upgrades is: **upgrade every
replica before anything uses a new command, a new field or a new version**. A release
keeps writing what the previous release reads until then (deploy/README.md, "Rolling
upgrade"). ``synctl cluster -o json`` shows each replica's ``format_version`` to check.

"Keeps writing what the previous release reads" is mechanical for added fields: a field
listed in ``ADDED_FIELDS`` (:mod:`synapse_ha.core.codec.formats`) is written only when it
differs from its default. A command or state that does not use a new feature (a job in
the ``default`` queue, no preemption) therefore encodes exactly as the previous release
wrote it, and a replica of that release applies it; one that uses a new feature carries
the field, and that replica refuses it as above.

The compact state. With ``ClusterConfig.compact_state`` on (a replicated setting, so every
replica encodes alike) every dataclass of the state is written as a list of its field
values in declaration order, without the trailing fields that hold their defaults:
the field names, repeated for every job and node, were most of a large state's bytes.
Decoding reads a list where an object is expected by position and fills the defaults
back in. The declaration order is therefore part of the format: a field is only ever
appended, with a default (``tests/core/test_codec_layout.py`` holds every state type to
the layout it had). Turning the compact state on is itself a new field: only once every
replica runs this release.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec.decode_errors import CodecError, UnreadableFormat
from synapse_ha.core.codec.from_plain import from_plain
from synapse_ha.core.codec.to_plain import to_plain, to_plain_compact
from synapse_ha.core.codec.v1 import upgrade_command_v1, upgrade_state_v1
from synapse_ha.core.collector import collector_paused
from synapse_ha.core.model import ClusterState

# Version 2: reasons and attempt outcomes are Reason values (code, params, cause), not
# sentences. Version 1 envelopes still decode: their sentences become TEXT reasons.
COMMAND_VERSION = 2
STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
READABLE_VERSIONS = _READABLE_VERSIONS

_COMMANDS_BY_NAME: dict[str, type] = {t.__name__: t for t in cmd.COMMAND_TYPES}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_JSON = json.JSONDecoder()  # json.loads without its per-call dispatch


Parse = Callable[[bytes], Any]  # a JSON parser giving what json.loads gives


def _loads(data: bytes, what: str, parse: Parse | None = None) -> Any:
    """Our encodings are UTF-8 (``_dumps``); decoded here, not guessed per call. With
    ``parse``, that parser is tried first; what it refuses is parsed again here, which
    takes it or names the error."""
    if parse is not None:
        try:
            return parse(data)
        except ValueError:
            pass
    try:
        return _JSON.decode(data.decode() if isinstance(data, (bytes, bytearray)) else data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"{what}: not valid JSON ({exc})") from None


def encode_command(command: cmd.Command) -> bytes:
    """The canonical envelope ``{"v": 1, "type": name, "body": {...}}`` as UTF-8 bytes."""
    return _dumps({"v": COMMAND_VERSION, "type": type(command).__name__, "body": to_plain(command)})


def decode_command(data: bytes) -> cmd.Command:
    envelope = _loads(data, "command")
    if not isinstance(envelope, dict):
        raise CodecError("command: expected an envelope object")
    version = envelope.get("v")
    if type(version) is int and version > max(_READABLE_VERSIONS):
        raise UnreadableFormat(
            f"command: format version {version} is newer than this replica reads "
            f"({', '.join(map(str, _READABLE_VERSIONS))}); upgrade this replica"
        )
    if version not in _READABLE_VERSIONS:
        raise CodecError(f"command: unsupported envelope version {version!r}")
    name = envelope.get("type")
    command_type = _COMMANDS_BY_NAME.get(name) if isinstance(name, str) else None
    if command_type is None:
        raise UnreadableFormat(
            f"command: unknown command type {name!r} (from a newer release? upgrade this replica)"
        )
    body = envelope.get("body")
    if version == 1:
        body = upgrade_command_v1(str(name), body)
    result: cmd.Command = from_plain(command_type, body, str(name))
    return result


def encode_state(state: ClusterState) -> bytes:
    """The whole state, canonical: equal states give equal bytes. Compact (each
    dataclass a list of its field values) once the replicated ``config.compact_state``
    says so; every replica applies the same config, so they still write the same bytes."""
    walk = to_plain_compact if state.config.compact_state else to_plain
    with collector_paused():
        return _dumps({"v": STATE_VERSION, "state": walk(state)})


def decode_state(data: bytes, parse: Parse | None = None) -> ClusterState:
    """The state ``data`` encodes. ``parse``: a faster JSON parser to try first (one
    that gives what ``json.loads`` gives for what it accepts; a replica passes one in
    from outside the core, :mod:`synapse_ha.raft.snapshot_file`): the result is the
    same with or without it."""
    with collector_paused():
        return _decode_state(data, parse)


def _decode_state(data: bytes, parse: Parse | None) -> ClusterState:
    envelope = _loads(data, "state", parse)
    version = envelope.get("v") if isinstance(envelope, dict) else None
    if type(version) is int and version > max(_READABLE_VERSIONS):
        raise UnreadableFormat(
            f"state: format version {version} is newer than this replica reads "
            f"({', '.join(map(str, _READABLE_VERSIONS))}); upgrade this replica"
        )
    if not isinstance(envelope, dict) or version not in _READABLE_VERSIONS:
        raise CodecError("state: unsupported snapshot version")
    body = envelope.get("state")
    if envelope.get("v") == 1:
        body = upgrade_state_v1(body)
    state: ClusterState = from_plain(ClusterState, body, "state")
    _share_array_specs(state)
    return state


def _share_array_specs(state: ClusterState) -> None:
    """An array's tasks share its spec in memory, as the state machine made them (the
    encoded state repeats it per task)."""
    for array in state.arrays.values():
        for task_id in array.task_ids():
            task = state.jobs.get(task_id)
            if task is not None and task.spec == array.spec:
                task.spec = array.spec


def encode_result(result: cmd.Result) -> bytes:
    return _dumps(to_plain(result))


def decode_result(data: bytes) -> cmd.Result:
    result: cmd.Result = from_plain(cmd.Result, _loads(data, "result"), "result")
    return result
