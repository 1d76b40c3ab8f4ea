"""A member's container as its supervisor handles it: the environment file the runtime
reads, the commands that end the container, and the container's files.

The job's variables reach the container through an environment file (``--env-file``)
written just before the runtime starts, mode 0600, in a directory of its own
(``container/`` in the member directory) that only the runtime's account can enter: root,
or the job's owner with a rootless runtime. The runtime writes the container's id to
``--cidfile`` in the same directory once it has read the file, and the file is removed
then; the directory goes when the member ends. Killing the runtime client does not end
the container, which lives under the runtime's monitor: the launch record's
``container_stop`` commands (``RUNTIME kill NAME``, ``RUNTIME rm -f NAME``) do, run with
the runtime's fixed environment and account.

Part of the supervisor (:mod:`synapse_ha.worker.shim`): standard library only, and
neither pathlib nor typing, which would slow every member start.
"""

from __future__ import annotations

import contextlib
import os
import subprocess

from synapse_ha.worker.procgroup import drop_to

# No typing at run time: mypy reads the annotations; the interpreter never imports it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONTAINER_STOP_TIMEOUT_S = 10.0


def stop_containers(
    argvs: list[list[str]],
    timeout_s: float = CONTAINER_STOP_TIMEOUT_S,
    *,
    env: dict[str, str] | None = None,
    run_as: dict[str, Any] | None = None,
) -> None:
    """Run each command that ends a member's container (``RUNTIME kill NAME``, then
    ``RUNTIME rm -f NAME``), in order, with the runtime's own fixed environment and as
    the account that runs the runtime (``run_as``: the owner with a rootless runtime).
    Failures are ignored: the container may be gone already, and the next command or a
    later agent start tries again."""
    for argv in argvs:
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                preexec_fn=(lambda: drop_to(run_as)) if run_as else None,
                timeout=timeout_s,
                check=False,
            )


def remove_container_dir(path: str) -> None:
    """Remove a member's container directory and whatever is in it. Links in it are
    removed, never followed (with a rootless runtime its owner can write there)."""
    import shutil  # only members in containers pay for the import

    with contextlib.suppress(OSError):
        shutil.rmtree(path)


def _env_file_name_ok(name: str) -> bool:
    """A variable name an env file can carry: letters, digits and _, not a digit first."""
    return (
        bool(name)
        and not name[0].isdigit()
        and all(c == "_" or (c.isascii() and c.isalnum()) for c in name)
    )


def error_kind(exc: BaseException) -> str:
    """The error's kind without its file names."""
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    return type(exc).__name__


class MemberContainer:
    """The container side of one launch record: ``files`` (the ``container`` entry:
    directory, env file, id file, the variables and the owner of the files; None when
    the member runs on the host) and the commands that end the container."""

    def __init__(self, launch: dict[str, Any]) -> None:
        self.files: dict[str, Any] | None = launch.get("container")
        self.stop_argvs: list[list[str]] = [
            [str(word) for word in argv] for argv in launch.get("container_stop", [])
        ]
        # The runtime's own environment and account (the owner's with a rootless runtime).
        self.runtime_env: dict[str, str] = launch["env"]
        self.runtime_run_as: dict[str, Any] | None = launch.get("run_as")
        self.stopped = False
        self.env_file_removed = False

    def write_env_file(self) -> str | None:
        """For a member in a container: write its variables to the environment file the
        runtime reads (``--env-file``), in a directory of its own that only the account
        running the runtime can enter (root, or the owner with a rootless runtime);
        return why it could not, or None. The runtime's own environment is the fixed
        one in the launch record: no variable of the job's ever reaches it."""
        files = self.files
        if files is None:
            return None
        lines = []
        for name, value in files["env"].items():
            if not _env_file_name_ok(name) or any(c in value for c in "\n\r\x00"):
                return "could not run the container: a variable cannot be passed in an env file"
            lines.append(f"{name}={value}\n")
        owner = files.get("owner")
        try:
            os.mkdir(files["dir"], 0o700)
            fd = os.open(
                files["env_file"],
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                0o600,
            )
            with open(fd, "w", encoding="utf-8") as env_file:
                env_file.write("".join(lines))
                if owner:
                    os.fchown(fd, int(owner[0]), int(owner[1]))
            if owner:
                # Last: until now only root could enter the directory.
                os.chown(files["dir"], int(owner[0]), int(owner[1]))
        except OSError as exc:
            self.remove_files()
            return f"could not write the container's environment file: {error_kind(exc)}"
        return None

    def forget_env_file_once_created(self) -> None:
        """Remove the environment file once the runtime has created the container (it
        writes the container's id to ``--cidfile`` after it has read the file)."""
        files = self.files
        if files is None or self.env_file_removed:
            return
        if os.path.exists(files["cidfile"]):
            with contextlib.suppress(OSError):
                os.unlink(files["env_file"])
            self.env_file_removed = True

    def stop(self) -> None:
        """End the member's container, once. The runtime's monitor keeps a container
        running when only the runtime client in the member's group is killed."""
        if self.stop_argvs and not self.stopped:
            self.stopped = True
            stop_containers(self.stop_argvs, env=self.runtime_env, run_as=self.runtime_run_as)

    def remove_files(self) -> None:
        """Remove the container's directory (environment file, id file), whatever is in
        it; safe against links planted in it (the removal never follows them)."""
        if self.files is not None:
            remove_container_dir(self.files["dir"])
