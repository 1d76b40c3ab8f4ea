"""``synapse-worker``'s settings of how members run: the container runtime for members
whose job names an image, the account members run as (``run_as``, ``[user_map]``,
``allow_root_members``), the variables of the agent's environment members get
(``member_env_passthrough``) and whether members may share the node's PID namespace
(``allow_shared_pid_namespace``)."""

from __future__ import annotations

from typing import Any, NamedTuple

from synapse_ha.programs.config_file import ConfigError
from synapse_ha.programs.settings import Inputs, defaulted, setting, true_or_false
from synapse_ha.worker.accounts import RunAsMode, parse_user_map
from synapse_ha.worker.environment import env_name_problem
from synapse_ha.worker.images import ImageRuntime


def _user_map(value: Any) -> tuple[tuple[str, str], ...]:
    try:
        return parse_user_map(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _allow_root(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError("allow_root_members: must be true or false")
    return value


IMAGE_RUNTIME = defaulted(
    "image_runtime",
    "",
    str,
    "container runtime command, e.g. podman or docker; members whose job names an "
    "image run through it and the node offers the images feature",
)
IMAGE_RUN_ARGS = defaulted(
    "image_run_args",
    "",
    str,
    'extra options for the runtime\'s run command, e.g. "--ipc host --shm-size 16g" '
    "(long forms only; options that change the container's identity, capabilities or "
    "security options are refused)",
)
IMAGE_CAP_ADD = setting(
    "--image-cap-add",
    "image_cap_add",
    merge="both",
    action="append",
    flag_default=[],
    metavar="CAPABILITY",
    help="a capability containers keep (repeatable; default: every one is dropped)",
)
ROOTLESS_RUNTIME = setting(
    "--rootless-runtime",
    "rootless_runtime",
    default=False,
    blank_is_default=True,
    action="store_true",
    help="run the image runtime as each member's owner (rootless podman; needs "
    "--run-as owner): the preferred mode",
)
IMAGES = (IMAGE_RUNTIME, IMAGE_RUN_ARGS, IMAGE_CAP_ADD, ROOTLESS_RUNTIME)

RUN_AS = setting(
    "--run-as",
    "run_as",
    choices=[m.value for m in RunAsMode],
    help="owner: members run as their job's owner (needs root); agent: as this "
    "agent's user (default: owner when run as root, else agent)",
)
USER_MAP = setting(
    "--user-map",
    "user_map",
    merge="truthy",
    default=(),
    check=_user_map,
    action="append",
    flag_default=[],
    metavar="USER=ACCOUNT",
    help="run USER's members as the local ACCOUNT (repeatable)",
)
ALLOW_ROOT_MEMBERS = setting(
    "--allow-root-members",
    "allow_root_members",
    default=False,
    check=_allow_root,
    blank_is_default=True,
    action="store_true",
    help="let members run as root when their owner maps to it (default: refused)",
)
ACCOUNTS = (RUN_AS, USER_MAP, ALLOW_ROOT_MEMBERS)


def _passthrough(value: Any) -> tuple[str, ...]:
    names: list[str] = []
    for item in value:
        for name in filter(None, (part.strip() for part in str(item).split(","))):
            problem = env_name_problem(name)
            if problem:
                raise ConfigError(f"member_env_passthrough: {problem}")
            names.append(name)
    return tuple(dict.fromkeys(names))


MEMBER_ENV_PASSTHROUGH = setting(
    "--member-env-passthrough",
    "member_env_passthrough",
    merge="both",
    default=(),
    check=_passthrough,
    action="append",
    flag_default=[],
    metavar="NAME",
    help="a variable of this agent's environment that members get as it is (repeatable, "
    "or NAME,NAME); members get no other variable of the agent's",
)
ALLOW_SHARED_PID_NAMESPACE = setting(
    "--allow-shared-pid-namespace",
    "allow_shared_pid_namespace",
    default=False,
    check=true_or_false("allow_shared_pid_namespace"),
    blank_is_default=True,
    action="store_true",
    help="with --run-as owner, start even where members cannot get a PID namespace of "
    "their own: every member then sees every process of the node, other users' command "
    "lines too (synctl nodes shows it)",
)
PROCESSES = (MEMBER_ENV_PASSTHROUGH, ALLOW_SHARED_PID_NAMESPACE)


class ImageOptions(NamedTuple):
    """The container runtime (a command; "" for none) and the options it runs with."""

    runtime: str
    run_args: str
    cap_add: list[str]
    rootless: bool


def image_options(inputs: Inputs) -> ImageOptions:
    """The container runtime and its options; the options only with a runtime."""
    options = ImageOptions(
        inputs.value(IMAGE_RUNTIME),
        inputs.value(IMAGE_RUN_ARGS),
        inputs.value(IMAGE_CAP_ADD),
        inputs.value(ROOTLESS_RUNTIME),
    )
    for flag, given in (
        ("--image-run-args", options.run_args),
        ("--image-cap-add", options.cap_add),
        ("--rootless-runtime", options.rootless),
    ):
        if given and not options.runtime:
            raise ConfigError(f"{flag} needs --image-runtime")
    return options


def members_run_as(flag: object, euid: int) -> RunAsMode:
    """The mode asked for, else owner when running as root and agent otherwise."""
    if flag is None:
        return RunAsMode.OWNER if euid == 0 else RunAsMode.AGENT
    try:
        mode = RunAsMode(str(flag))
    except ValueError:
        raise ConfigError(f"--run-as: must be owner or agent, got {flag!r}") from None
    if mode is RunAsMode.OWNER and euid != 0:
        raise ConfigError(
            "--run-as owner needs the agent to run as root (it switches to each owner's "
            "account); use --run-as agent"
        )
    return mode


def image_runtime(
    options: ImageOptions, run_as: RunAsMode, *, gpu_devices: bool
) -> ImageRuntime | None:
    """The runtime as it will run, or None without one."""
    if options.rootless and run_as is not RunAsMode.OWNER:
        raise ConfigError(
            "--rootless-runtime runs the runtime as each member's owner: it needs "
            "--run-as owner (and the agent running as root)"
        )
    if not options.runtime:
        return None
    try:
        return ImageRuntime.parse(
            options.runtime,
            options.run_args,
            gpu_devices=gpu_devices,
            cap_add=options.cap_add,
            rootless=options.rootless,
        )
    except ValueError as exc:
        raise ConfigError(f"--image-runtime: {exc}") from None
