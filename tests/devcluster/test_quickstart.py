"""README.md's "play with a cluster yourself" commands, exactly as written there, from a
fresh account: no SYNAPSE_* variable, HOME and the XDG directories in a temporary
directory. The first command (`synctl dev up`) runs in the background until the test
stops it with Ctrl-C; every other command must exit 0, and the gang must complete. The
README's Python example then runs against the same cluster from another directory. The
dashboard's address is the first thing dev up prints, and it serves there. The
README's CLI table must list every command and exit code synctl has.

The commands are read from the README, so the test follows it when it changes."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import urllib.request
from pathlib import Path

import click
import pytest

from synapse_ha.cli.defaults import ExitCode
from synapse_ha.cli.main import cli
from synapse_ha.local.waiting import wait_until
from synapse_ha.security.bundle import ClusterCredentials
from tests.devcluster.procs import (
    MARKER_VARIABLE,
    kill_marked,
    new_marker,
    wait_no_marked_processes,
)
from tests.leftovers import SESSION_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
READY = "ready; press Ctrl-C to stop"


def quickstart_commands(readme: str) -> list[str]:
    """The command lines of the README's shell block that starts `synctl dev up`, with
    comment-only lines left out (the shell would skip them too)."""
    for block in re.findall(r"```sh\n(.*?)```", readme, flags=re.DOTALL):
        lines = [line for line in block.splitlines() if line.strip()]
        if lines and re.search(r"synctl dev up\b", lines[0]):
            return [line for line in lines if not line.lstrip().startswith("#")]
    raise AssertionError("README.md has no ```sh block starting with `synctl dev up`")


def fresh_environment(home: Path, marker: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        MARKER_VARIABLE: marker,
    }
    if os.environ.get(SESSION_VARIABLE):
        env[SESSION_VARIABLE] = os.environ[SESSION_VARIABLE]  # the suite's leftover check
    (home / "tmp").mkdir(parents=True)
    return env


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_cli_table_lists_every_command_and_exit_code() -> None:
    """Every command `synctl --help` lists, and every subcommand of a group, is in a row
    of the README's CLI table; every exit code is in the paragraph after it."""
    section = readme_section("The CLI at a glance")
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    missing = []
    for name, command in sorted(cli.commands.items()):
        mine = [r for r in rows if re.search(rf"(synctl |/ `|\\\|){name}\b", r)]
        if not mine:
            missing.append(name)
        elif isinstance(command, click.Group):
            missing += [f"{name} {sub}" for sub in command.commands if sub not in " ".join(mine)]
    assert missing == []
    for code in ExitCode:
        assert f"**{int(code)}**" in section, code


def test_the_quickstart_block_is_found() -> None:
    commands = quickstart_commands((ROOT / "README.md").read_text())
    assert commands[0].startswith(".venv/bin/synctl dev up")
    assert any("submit examples/cpu-gang.yaml" in c for c in commands)


@pytest.mark.integration
def test_the_readme_quickstart_works_as_written(tmp_path: Path) -> None:
    if not (ROOT / ".venv" / "bin" / "synctl").exists():
        pytest.skip("the README's commands use .venv/bin/synctl; run `make` first")
    up, *commands = quickstart_commands((ROOT / "README.md").read_text())
    marker = new_marker()
    env = fresh_environment(tmp_path / "home", marker)
    log = tmp_path / "dev-up.txt"
    with open(log, "wb") as out:
        dev_up = subprocess.Popen(
            ["bash", "-c", up],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:

        def ready() -> bool:
            assert dev_up.poll() is None, f"dev up exited early:\n{log.read_text()}"
            return READY in log.read_text()

        wait_until("dev up to print that it is ready", ready, 120, every_s=0.2)
        # The dashboard first, at a fixed port unless it was taken (then said), and served.
        printed = log.read_text().splitlines()
        at = next(i for i, line in enumerate(printed) if line.startswith("dashboard: "))
        shown = re.fullmatch(
            r"dashboard: (https://127\.0\.0\.1:(\d+)/) \(replica a's; every replica serves "
            r"one\) — sign in with the admin token in (\S+)",
            printed[at],
        )
        assert shown is not None, printed[at]
        listed = printed.index("replicas:")
        assert at < listed and all(" is in use: " in line for line in printed[at + 1 : listed])
        assert shown[2] == "7191" or "7191 is in use" in printed[at + 1], printed[at:listed]
        ca = ClusterCredentials.ensure(Path(shown[3]).parent).ca
        context = ssl.create_default_context(cafile=str(ca))
        with urllib.request.urlopen(shown[1] + "login", context=context, timeout=10) as page:
            assert page.status == 200 and b'id="token"' in page.read()
        outputs = []
        for command in commands:
            result = subprocess.run(
                ["bash", "-c", command],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert result.returncode == 0, (command, result.stdout, result.stderr)
            outputs.append(result.stdout)
        followed = next(o for c, o in zip(commands, outputs, strict=True) if "--follow" in c)
        for rank in range(4):
            assert f"rank {rank} of 4" in followed, followed
        listed = next(o for c, o in zip(commands, outputs, strict=True) if " jobs" in c)
        assert re.search(r"cpu-gang\s.*succeeded", listed, flags=re.IGNORECASE), listed
        # The README's Python example, from another directory.
        (example,) = [
            b
            for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
            if "Cluster.from_env()" in b
        ]
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        python = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "python"), "-c", example],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert python.returncode == 0, (python.stdout, python.stderr)
        assert "rank 1 of 2" in python.stdout
        assert python.stdout.strip().splitlines()[-1].lower().endswith("succeeded")
        os.killpg(dev_up.pid, signal.SIGINT)
        assert dev_up.wait(timeout=60) == 0, log.read_text()
        assert log.read_text().splitlines()[-1] == "stopped"
        assert not (tmp_path / "home" / ".config" / "synapse" / "dev-cluster.json").exists()
        assert wait_no_marked_processes(marker, timeout_s=5) == []
    finally:
        if dev_up.poll() is None:
            os.killpg(dev_up.pid, signal.SIGKILL)
            dev_up.wait(timeout=10)
        kill_marked(marker)
