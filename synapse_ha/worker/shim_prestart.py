"""A job's pre-start check, run by the member's supervisor before the member: as the
member would run (its account, its environment, its working directory; on the host,
also for a member whose job names an image), in a process group of its own, in a PID
namespace of its own when the member's is (:mod:`~synapse_ha.worker.pidns`).

Exit 0 passes and the member starts. A non-zero exit, a check that cannot be run, or one
still running after its timeout (its group is killed) fails: the member is not started,
and its exit is the node's fault (``node_cannot_run``: the gang is requeued, the node is
unfit for the job's owner for a while), with the detail ``prestart check failed:`` and
the check's first output line, else how it ended. While it runs the supervisor still
obeys the lease, the agent and a stop, as it does for the member.

Its output is kept in the member directory (``prestart.out``, ``prestart.err``).

Part of the supervisor: standard library only (see :mod:`synapse_ha.worker.shim`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from synapse_ha.worker.check_output import READ_LIMIT, failure_message
from synapse_ha.worker.pidns import NamespacedProcess, StartFailure, start_stepped
from synapse_ha.worker.procgroup import signal_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

POLL_S = 0.05
PASSED = ""
FAILED = "failed"
INTERRUPTED = "interrupted"


def run_prestart(
    record: dict[str, Any],
    member_dir: str,
    before_exec: Callable[[int], Callable[[], None]],
    interrupted: Callable[[], str],
) -> tuple[str, str]:
    """Run the check of ``record`` (``argv``, ``env``, ``timeout_s``; ``before_exec``
    makes what its process does before exec: the member's account and directory, its
    failing step written to the descriptor given). Returns (:data:`PASSED`, ""),
    (:data:`FAILED`, what it said) or (:data:`INTERRUPTED`, what ``interrupted`` said:
    the supervisor must stop)."""
    timeout_s = float(record.get("timeout_s", 60.0))
    paths = [os.path.join(member_dir, name) for name in ("prestart.out", "prestart.err")]
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    out, err = (os.open(path, flags, 0o600) for path in paths)
    try:
        proc = start_stepped(
            record["argv"], record["env"], out, err, before_exec, bool(record.get("pid_namespace"))
        )
    except StartFailure as failure:
        for fd in (out, err):
            os.close(fd)
        step = failure.step.decode("ascii", errors="replace")
        return FAILED, f"could not run it ({step or type(failure.cause).__name__})"
    try:
        code, why = _wait(proc, timeout_s, interrupted)
        if why:
            return INTERRUPTED, why
        if code == 0:
            return PASSED, ""
        stdout, stderr = (os.pread(fd, READ_LIMIT, 0) for fd in (out, err))
        return FAILED, failure_message(code, timeout_s, stdout, stderr)
    finally:
        for fd in (out, err):
            os.close(fd)


def _wait(
    proc: subprocess.Popen[bytes] | NamespacedProcess,
    timeout_s: float,
    interrupted: Callable[[], str],
) -> tuple[int | None, str]:
    """The check's exit code (None: timed out) or why it was cut short; its group is
    gone either way."""
    deadline = time.monotonic() + timeout_s
    code: int | None = None
    why = ""
    while True:
        code = proc.poll()
        if code is not None:
            break
        why = interrupted()
        if why or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    signal_group(proc.pid, signal.SIGKILL)  # nothing it started outlives it
    if code is None:
        proc.wait()
    return code, why
