"""How both programs declare and read a setting: once, with its flag, its key in the TOML
file, how the two merge (a flag wins over the file), its default and its check
(:class:`Setting`); and the loading steps both programs share: the flags parsed, the file
read and its value types checked (:class:`Inputs`), TLS, served addresses, the data
directory. Each program declares only its own settings, grouped by section, and checks
the settings that depend on each other itself."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from synapse_ha.observe.http import AddressError, parse_address
from synapse_ha.programs.config_file import ConfigError, check_file_types, read_toml
from synapse_ha.security.tls import TlsError, TlsFiles, tls_from

# How a flag and the file's key merge: the flag wins when it is "given" (not None), or
# only when it is "truthy" (an empty flag leaves the file's value); "both" lists the
# file's entries, then the flags'.
Merge = Literal["given", "truthy", "both"]


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of a program; :func:`setting` declares one.

    ``flag`` is its command-line option, described to argparse by ``options`` (help,
    type, action, metavar, dest, its own ``default``). ``key`` is its place in the TOML
    file, dotted for a key of a table (``"timeouts.lease_ttl"``); "" for a flag alone.
    ``negated``: the flag says the opposite of the key (``--no-history`` and
    ``history.enabled``). A value neither gives (or a blank one, with
    ``blank_is_default``) is ``default``; any other goes through ``check``, which returns
    the value to use or raises :class:`ConfigError`.
    """

    flag: str
    key: str = ""
    merge: Merge = "given"
    default: Any = None
    check: Callable[[Any], Any] | None = None
    blank_is_default: bool = False
    negated: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        """The attribute of the parsed flags that holds this setting's flag."""
        dest = self.options.get("dest")
        return str(dest) if dest else self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(self.flag, **self.options)


def setting(
    flag: str,
    key: str = "",
    *,
    merge: Merge = "given",
    default: Any = None,
    check: Callable[[Any], Any] | None = None,
    blank_is_default: bool = False,
    negated: bool = False,
    flag_default: Any = None,
    **options: Any,
) -> Setting:
    """A :class:`Setting`; ``flag_default`` is what argparse holds for a flag not given
    (``[]`` for a repeatable flag), the other keywords are argparse's."""
    return Setting(
        flag,
        key,
        merge,
        default,
        check,
        blank_is_default,
        negated,
        {**options, "default": flag_default},
    )


def defaulted(key: str, default: Any, check: Callable[[Any], Any], help: str) -> Setting:
    """The setting of the flag and file key named ``key`` (dashes in the flag), whose
    blank value stands for ``default``."""
    flag = f"--{key.replace('_', '-')}"
    return setting(flag, key, default=default, check=check, blank_is_default=True, help=help)


def add_settings(parser: argparse.ArgumentParser, *sections: Iterable[Setting]) -> None:
    """The flags of every setting of ``sections``, in their order (the order of --help)."""
    for section in sections:
        for item in section:
            item.add_to(parser)


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A program's flag parser, with ``--config``, the TOML file the flags override."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="TOML configuration file")
    return parser


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a program was started with: its parsed flags and its configuration file."""

    flags: argparse.Namespace
    file: Mapping[str, Any]

    @classmethod
    def read(
        cls,
        flags: argparse.Namespace,
        file_types: Mapping[str, type | tuple[type, ...]],
        string_lists: Collection[str] = (),
    ) -> Inputs:
        """The flags with the file ``--config`` names, its keys' value types checked
        (:func:`check_file_types`)."""
        doc = read_toml(flags.config)
        check_file_types(doc, file_types, string_lists)
        return cls(flags, doc)

    def in_file(self, item: Setting) -> Any:
        """The file's value for ``item``; None when the file has none."""
        if not item.key:
            return None
        *tables, name = item.key.split(".")
        where: Mapping[str, Any] = self.file
        for table in tables:
            where = where.get(table, {})
        return where.get(name)

    def raw(self, item: Setting) -> Any:
        """``item`` as given, unchecked: its flag where the flag wins, else the file's
        value; None when neither gives one."""
        flag = getattr(self.flags, item.dest)
        if item.merge == "both":
            return [*(self.in_file(item) or []), *flag]
        wins = flag is not None if item.merge == "given" else bool(flag)
        if wins:
            return not flag if item.negated else flag
        return self.in_file(item)

    def value(self, item: Setting) -> Any:
        """``item`` checked, or its default when neither flag nor file gives it."""
        raw = self.raw(item)
        if raw is None or (item.blank_is_default and not raw):
            return item.default
        return raw if item.check is None else item.check(raw)


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    return parser.parse_args(list(argv))


def true_or_false(key: str) -> Callable[[Any], bool]:
    """The check of a setting that is true or false (TOML booleans only)."""

    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value

    return check


def switch(key: str, help: str, *, flag: str = "", default: bool | None = None) -> Setting:
    """A setting that is on or off: ``--flag``/``--no-flag`` on the command line (the
    flag is the key's last part with dashes unless given), true or false in the file."""
    flag = flag or f"--{key.rpartition('.')[2].replace('_', '-')}"
    return setting(
        flag,
        key,
        default=default,
        check=true_or_false(key),
        action=argparse.BooleanOptionalAction,
        help=help,
    )


def tls_files(inputs: Inputs) -> TlsFiles | None:
    """The TLS files of ``--tls-*`` and ``[tls]``; None with ``insecure``."""
    try:
        return tls_from(inputs.flags, inputs.file)
    except TlsError as exc:
        raise ConfigError(str(exc)) from None


def served_address(what: str) -> Callable[[Any], str]:
    """The check of an address a program serves on, ``HOST:PORT`` (port 0: any free
    port); a blank one serves nothing."""

    def check(value: Any) -> str:
        if value:
            try:
                parse_address(str(value), what)
            except AddressError as exc:
                raise ConfigError(str(exc)) from None
        return str(value)

    return check


def metrics_address(help: str) -> Setting:
    """``--metrics-address`` and ``[metrics] address``: where /metrics is served."""
    return setting(
        "--metrics-address",
        "metrics.address",
        merge="truthy",
        default="",
        check=served_address("metrics address"),
        help=help,
    )


def writable_directory(path: str) -> None:
    """``path`` is a directory this process can write in, created if missing."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-probe")
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"data directory {path!r} is not writable: {exc}") from None
