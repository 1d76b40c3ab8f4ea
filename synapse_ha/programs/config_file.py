"""What both programs' configurations share: the error they refuse to start with, the
TOML file read and its value types checked, addresses and durations; and what both do at
start (:func:`load_program_config`, :func:`stop_on_signals`)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from synapse_ha.core.spec.document import SpecError, parse_duration
from synapse_ha.security.tls import INSECURE_WARNING


class ConfigError(Exception):
    """A configuration a program refuses to start with; the message says why."""


_TYPE_NAMES = {str: "a string", list: "an array", dict: "a table", bool: "true or false"}


def read_toml(path: str | None) -> dict[str, Any]:
    """The document in the TOML file at ``path`` (``--config``); empty without one."""
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None


def check_file_types(
    doc: Mapping[str, Any],
    types: Mapping[str, type | tuple[type, ...]],
    string_lists: Collection[str] = (),
) -> None:
    """Every key of ``types`` that ``doc`` has holds a value of its type(s); every key of
    ``string_lists`` that holds an array holds strings only; ``[tls]`` names files."""
    for key, kinds in types.items():
        value = doc.get(key)
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if value is not None and not isinstance(value, allowed):
            wanted = " or ".join(_TYPE_NAMES[k] for k in allowed)
            raise ConfigError(f"{key}: must be {wanted}, got {type(value).__name__}")
    for key in string_lists:
        items = doc.get(key)
        if isinstance(items, list) and not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{key}: every entry must be a string")
    tls = doc.get("tls", {})
    for name, value in tls.items() if isinstance(tls, dict) else ():
        if not isinstance(value, str):
            raise ConfigError(f"tls.{name}: must be a string (a file name)")


def address(value: str, what: str, *, form: str = "host:port", port_zero: bool = False) -> str:
    """``value`` when it is ``host:port`` with a port number (0, "any free port", only
    with ``port_zero``); else :class:`ConfigError` naming ``what`` and the ``form``."""
    host, sep, port = value.rpartition(":")
    lowest = 0 if port_zero else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ConfigError(f"{what}: {value!r} is not {form}")
    return value


def duration_ms(value: object, what: str) -> int:
    """``value`` (``"30s"``, ``"10m"``, a number of seconds) in milliseconds."""
    try:
        return parse_duration(value, what)
    except SpecError as exc:
        raise ConfigError(str(exc)) from None


class _Started(Protocol):
    @property
    def log_level(self) -> str: ...
    @property
    def tls(self) -> object | None: ...


C = TypeVar("C", bound=_Started)


def load_program_config(
    program: str,
    load: Callable[[Sequence[str]], C],
    argv: Sequence[str] | None,
    log: logging.Logger,
) -> C | None:
    """``program``'s configuration from ``argv`` (None: the command line), its log level
    set and, when it runs without TLS, the insecure warning on ``log``; None when it is
    refused (said on standard error, after the program's name)."""
    try:
        config = load(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return None
    logging.getLogger().setLevel(config.log_level)
    if config.tls is None:
        log.warning("%s", INSECURE_WARNING)
    return config


def stop_on_signals(log: logging.Logger, what: str) -> threading.Event:
    """An event set when the process gets SIGTERM or SIGINT (logged on ``log`` with
    ``what`` the program does then). Call from the main thread."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("received %s; %s", signal.Signals(signum).name, what)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
