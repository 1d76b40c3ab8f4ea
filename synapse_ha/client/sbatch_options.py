"""sbatch's option syntax: which options exist, which take a value, and how a word on an
``#SBATCH`` line or a command line names one.

As sbatch (getopt_long) reads them: ``--name=value``, ``--name value``, ``-X value``,
``-Xvalue``; a long name may be shortened to any prefix that names one option only
(``--err`` is ``--error``; an exact name always wins, so ``--time`` is not ``--time-min``);
an option whose value is optional (``--exclusive``) takes one only after ``=``; flags
(``--requeue``, ``-H``) take none. Aliases (``--tasks-per-node``) read as the option they
stand for. :func:`split_options` returns every option under its full name, so that the
translation (:mod:`synapse_ha.client.sbatch`) handles each name once.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum


class Arg(Enum):
    REQUIRED = "required"
    OPTIONAL = "optional"  # only as --name=value
    NONE = "none"


class SbatchError(ValueError):
    """An option that cannot be translated; ``where`` names the script line or "command
    line", ``option`` the option as written."""

    def __init__(self, where: str, option: str, rule: str) -> None:
        super().__init__(f"{where}: {option}: {rule}")
        self.where = where
        self.option = option
        self.rule = rule


_R, _O, _N = Arg.REQUIRED, Arg.OPTIONAL, Arg.NONE

# sbatch's long options (Slurm 23.11's man page), with what they take.
LONG: dict[str, Arg] = {
    "account": _R, "acctg-freq": _R, "array": _R, "batch": _R, "bb": _R, "bbf": _R,
    "begin": _R, "chdir": _R, "cluster-constraint": _R, "clusters": _R, "comment": _R,
    "constraint": _R, "container": _R, "container-id": _R, "contiguous": _N,
    "core-spec": _R, "cores-per-socket": _R, "cpu-freq": _R, "cpus-per-gpu": _R,
    "cpus-per-task": _R, "deadline": _R, "delay-boot": _R, "dependency": _R,
    "distribution": _R, "error": _R, "exclude": _R, "exclusive": _O, "export": _R,
    "export-file": _R, "extra": _R, "extra-node-info": _R, "get-user-env": _O, "gid": _R,
    "gpu-bind": _R, "gpu-freq": _R, "gpus": _R, "gpus-per-node": _R, "gpus-per-socket": _R,
    "gpus-per-task": _R, "gres": _R, "gres-flags": _R, "help": _N, "hint": _R, "hold": _N,
    "ignore-pbs": _N, "input": _R, "job-name": _R, "kill-on-invalid-dep": _R,
    "licenses": _R, "mail-type": _R, "mail-user": _R, "mcs-label": _R, "mem": _R,
    "mem-bind": _R, "mem-per-cpu": _R, "mem-per-gpu": _R, "mincpus": _R, "network": _R,
    "nice": _O, "no-kill": _O, "no-requeue": _N, "nodefile": _R, "nodelist": _R,
    "nodes": _R, "ntasks": _R, "ntasks-per-core": _R, "ntasks-per-gpu": _R,
    "ntasks-per-node": _R, "ntasks-per-socket": _R, "open-mode": _R, "output": _R,
    "overcommit": _N, "oversubscribe": _N, "parsable": _N, "partition": _R, "power": _R,
    "prefer": _R, "priority": _R, "profile": _R, "propagate": _O, "qos": _R, "quiet": _N,
    "reboot": _N, "requeue": _N, "reservation": _R, "signal": _R, "sockets-per-node": _R,
    "spread-job": _N, "switches": _R, "test-only": _N, "thread-spec": _R,
    "threads-per-core": _R, "time": _R, "time-min": _R, "tmp": _R, "tres-per-task": _R,
    "uid": _R, "usage": _N, "use-min-nodes": _N, "verbose": _N, "version": _N, "wait": _N,
    "wait-all-nodes": _R, "wckey": _R, "wrap": _R,
    "wait-for-nodes": _N,  # synapse_ha's own (docs/slurm.md)
}  # fmt: skip

# Options of site plugins (SPANK), not sbatch's own: refused with what they are.
_SHIFTER = "a Shifter plugin option, not sbatch's (a job's container is its spec's image)"
_PYXIS = "a pyxis plugin option, not sbatch's (a job's container is its spec's image)"
PLUGIN_OPTIONS = {
    "image": _SHIFTER, "module": _SHIFTER, "volume": _SHIFTER,
    "container-image": _PYXIS, "container-mounts": _PYXIS, "container-workdir": _PYXIS,
    "container-name": _PYXIS, "container-writable": _PYXIS,
}  # fmt: skip

# Other names sbatch accepts for an option.
ALIASES = {"tasks-per-node": "ntasks-per-node", "mem_bind": "mem-bind"}

# Short options: the long option each stands for.
SHORT = {"A": "account", "a": "array", "b": "begin", "B": "extra-node-info",
         "C": "constraint", "c": "cpus-per-task", "D": "chdir", "d": "dependency",
         "e": "error", "F": "nodefile", "G": "gpus", "H": "hold", "h": "help",
         "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "M": "clusters",
         "m": "distribution", "N": "nodes", "n": "ntasks", "O": "overcommit",
         "o": "output", "p": "partition", "Q": "quiet", "q": "qos", "S": "core-spec",
         "s": "oversubscribe", "t": "time", "V": "version", "v": "verbose", "W": "wait",
         "w": "nodelist", "x": "exclude"}  # fmt: skip


def long_name(written: str, where: str) -> str:
    """The full name of the long option ``written`` (without ``--`` or its value): the
    name itself, an alias's option, or the one option it is a prefix of."""
    if written in LONG:
        return written
    if written in ALIASES:
        return ALIASES[written]
    matches = sorted(
        {ALIASES.get(n, n) for n in (*LONG, *ALIASES) if n.startswith(written)} & set(LONG)
    )
    if written in PLUGIN_OPTIONS:
        raise SbatchError(where, f"--{written}", PLUGIN_OPTIONS[written])
    if not written or not matches:
        raise SbatchError(where, f"--{written}", "not an sbatch option")
    if len(matches) > 1:
        names = ", ".join(f"--{m}" for m in matches)
        raise SbatchError(where, f"--{written}", f"ambiguous: it may be any of {names}")
    return matches[0]


def split_options(words: Sequence[str], where: str) -> list[tuple[str, str | None, str]]:
    """``(full name, value, as_written)`` for every option of ``words``; the value is
    None for a flag, or an optional value not given."""
    out: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            written, eq, value = word[2:].partition("=")
            name = long_name(written, where)
            arg = LONG[name]
            if eq and arg is Arg.NONE:
                raise SbatchError(where, word, "takes no value")
            if not eq and arg is Arg.REQUIRED:
                if i >= len(words):
                    raise SbatchError(where, word, "needs a value")
                value, i = words[i], i + 1
            out.append((name, value if eq or arg is Arg.REQUIRED else None, word))
        elif word.startswith("-") and len(word) >= 2:
            letter, rest = word[1], word[2:]
            name = SHORT.get(letter, "")
            if not name:
                raise SbatchError(where, word, "not an sbatch option")
            arg = LONG[name]
            if arg is Arg.NONE:
                out.append((name, None, word))
                if rest:  # grouped flags: -HQ
                    out.extend(split_options([f"-{rest}"], where))
                continue
            if arg is Arg.OPTIONAL:  # -kVALUE, or -k alone
                out.append((name, rest or None, word))
                continue
            if not rest:
                if i >= len(words):
                    raise SbatchError(where, word, "needs a value")
                rest, i = words[i], i + 1
            out.append((name, rest, word))
        else:
            raise SbatchError(where, word, "not an option (the script's arguments follow it)")
    return out


def script_position(words: Sequence[str]) -> int:
    """Where the script's name is in ``sbatch [options] script [args]``: the first word
    that is neither an option nor an option's value (``len(words)`` when none is). An
    option that is not sbatch's counts as a word with no value."""
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            written, eq, _value = word[2:].partition("=")
            try:
                arg = LONG[long_name(written, "command line")]
            except SbatchError:
                arg = Arg.NONE
            i += 2 if not eq and arg is Arg.REQUIRED else 1
        elif word.startswith("-") and len(word) >= 2:
            arg = LONG.get(SHORT.get(word[1], ""), Arg.NONE)
            i += 2 if len(word) == 2 and arg is Arg.REQUIRED else 1
        else:
            return i
    return len(words)
