"""A stand-in for podman that records exactly what the worker hands a container runtime.

:func:`install` writes an executable (``podman`` by default) into a directory. Run as
``RUNTIME run ...`` it records, as JSON in ``runs/<container name>.json``: its argv, its
whole environment, its uid, gid and groups, its working directory, and the env file it was
given (path, mode, owner and the variables in it), exactly as they are when the runtime
starts. It then behaves as a runtime would: it writes the container's id to
``--cidfile`` (after reading the env file, as podman does), takes the ids of ``--user``
and ``--group-add``, and execs the words after the image with the env file's variables
as the whole environment (plus a ``PATH`` when the file has none, as an image's default).
Any other subcommand (``kill NAME``, ``rm -f NAME``) is appended to ``stops`` with the
uid that ran it.

The image is recognised by name (``image``): it is the first word after ``run`` that
equals it. A command line without it is still recorded, and the runtime then exits 125
(podman's code for a container that could not be created).
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = """\
#!{python} -IS
import json, os, stat, sys

HERE = {here!r}
IMAGE = {image!r}
args = sys.argv[1:]
if not args or args[0] != "run":
    with open(os.path.join(HERE, "stops"), "a") as f:
        f.write(json.dumps({{"argv": args, "uid": os.getuid()}}) + "\\n")
    sys.exit(0)
at = args.index(IMAGE) if IMAGE in args else len(args)
options, command = args[1:at], args[at + 1:]
values = {{}}
for word in options:
    if word.startswith("--") and "=" in word:
        name, _, value = word[2:].partition("=")
        values.setdefault(name, []).append(value)
record = {{
    "argv": args,
    "env": dict(os.environ),
    "uid": os.getuid(),
    "gid": os.getgid(),
    "groups": sorted(os.getgroups()),
    "cwd": os.getcwd(),
}}
variables = {{}}
for path in values.get("env-file", []):
    st = os.stat(path)
    with open(path) as f:
        lines = f.read().splitlines()
    variables.update(line.split("=", 1) for line in lines if "=" in line)
    record["env_file"] = {{
        "path": path,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
        "dir_uid": os.stat(os.path.dirname(path)).st_uid,
        "variables": variables,
    }}
name = values.get("name", ["unnamed"])[0]
os.makedirs(os.path.join(HERE, "runs"), exist_ok=True)
with open(os.path.join(HERE, "runs", name + ".json"), "w") as f:
    json.dump(record, f)
if at == len(args):
    print("fake runtime: no image " + IMAGE + " on the command line", file=sys.stderr)
    sys.exit(125)
for path in values.get("cidfile", []):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"0123456789abcdef\\n")
    os.close(fd)
variables.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
if values.get("user") and os.getuid() == 0:
    uid, gid = (int(x) for x in values["user"][0].split(":"))
    os.setgroups([gid] + [int(g) for g in values.get("group-add", [])])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
for workdir in values.get("workdir", []):
    if os.path.isdir(workdir):
        os.chdir(workdir)
os.execve(command[0], command, variables)
"""


@dataclass(frozen=True)
class FakeRuntime:
    """The installed script (``path``) and what it recorded under ``directory``."""

    path: Path
    directory: Path

    def run(self, container_name: str) -> dict[str, Any]:
        """The record of ``run`` for the container ``container_name``."""
        doc: dict[str, Any] = json.loads(
            (self.directory / "runs" / f"{container_name}.json").read_text()
        )
        return doc

    def ran(self, container_name: str) -> bool:
        return (self.directory / "runs" / f"{container_name}.json").exists()

    def stops(self) -> list[dict[str, Any]]:
        path = self.directory / "stops"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


def install(
    directory: Path, image: str, name: str = "podman", python: str = sys.executable
) -> FakeRuntime:
    """Write the fake runtime as ``directory/name`` (mode 0755), run by ``python``; its
    records go to ``directory`` too (which must then be writable by whoever runs it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(SCRIPT).format(python=python, here=str(directory), image=image))
    path.chmod(0o755)
    return FakeRuntime(path, directory)
