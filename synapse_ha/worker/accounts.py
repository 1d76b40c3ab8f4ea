"""Whose account a member runs under (DESIGN §8, "jobs run as their owner").

A node runs members in one of two modes, fixed by its configuration (``--run-as``):

* ``owner``: each member runs as its job's owner. The owner's name goes through the node's
  user map (``--user-map alice=svc_alice``), else stays as it is, and is looked up in the
  local account database; the member gets that uid, its primary gid and its supplementary
  groups. Only an agent running as root can do this. A job without an owner (``""``) has
  no account to switch to: it would run as the agent, root, so it is refused as an owner
  that maps to root is (below).
* ``agent``: every member runs as the agent's own account, whoever owns the job.

The node advertises the mode at registration (:meth:`RunAsPolicy.advertised`): ``owner``
or ``agent:<the agent's user name>``.

Refusals are values (:class:`RunAsRefusal`), never exceptions: the executor turns them into
a member start failure whose detail says what is missing. An owner without a local account
and without a mapping is refused; so is an owner whose account is root (uid 0) unless the
node allows root members (``--allow-root-members``).

:func:`resolve_member_account` is pure over an injected account lookup;
:func:`local_account` is the lookup over ``pwd`` and ``os.getgrouplist`` (both injectable).
"""

from __future__ import annotations

import enum
import os
import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

ADVERTISED_OWNER = "owner"
ADVERTISED_AGENT_PREFIX = "agent:"


class RunAsMode(enum.StrEnum):
    OWNER = "owner"  # members run as their job's owner (the agent is root)
    AGENT = "agent"  # members run as the agent's own account


@dataclass(frozen=True, slots=True)
class Account:
    """A local account a member can run as."""

    name: str
    uid: int
    gid: int  # primary group
    groups: tuple[int, ...]  # every group the account belongs to, the primary one included
    home: str
    shell: str = ""  # its login shell ("": the account database names none)


class RunAsRefusalCode(enum.StrEnum):
    NO_ACCOUNT = "no_account"  # the owner has no local account and no user-map entry
    ROOT_REFUSED = "root_refused"  # the owner's account is root; the node does not allow it


@dataclass(frozen=True, slots=True)
class RunAsRefusal:
    """Why a member may not start on this node under its owner's account."""

    code: RunAsRefusalCode
    node_id: str
    owner: str
    mapped_to: str = ""  # the account name the user map gave, when there was an entry

    def describe(self) -> str:
        if self.code is RunAsRefusalCode.ROOT_REFUSED:
            return f"node {self.node_id} does not run members as root"
        if self.mapped_to:
            return (
                f"node {self.node_id} has no account {self.mapped_to} "
                f"(user {self.owner} maps to it with --user-map)"
            )
        return f"node {self.node_id} has no account for user {self.owner} (and no --user-map entry)"


class AccountLookup(Protocol):
    def __call__(self, name: str) -> Account | None:
        """The local account called ``name``, or None when there is none."""
        ...


@dataclass(frozen=True, slots=True)
class RunAsPolicy:
    """How this node chooses a member's account. ``user_map`` pairs are (job owner, local
    account name), at most one per owner."""

    mode: RunAsMode
    node_id: str
    agent_user: str  # the agent's own account name, as advertised in mode agent
    user_map: tuple[tuple[str, str], ...] = ()
    allow_root_members: bool = False

    def advertised(self) -> str:
        """What the node registers as ``members_run_as``."""
        if self.mode is RunAsMode.OWNER:
            return ADVERTISED_OWNER
        return ADVERTISED_AGENT_PREFIX + self.agent_user

    def account_name(self, owner: str) -> str:
        """The local account name for ``owner``: its user-map entry, else the same name."""
        return dict(self.user_map).get(owner, owner)


def resolve_member_account(
    policy: RunAsPolicy, owner: str, lookup: AccountLookup
) -> Account | RunAsRefusal | None:
    """The account a member of ``owner``'s job runs as on this node.

    None means "as the agent's own account" (mode agent, or a job without an owner on a
    node that allows root members). An :class:`Account` is the owner's account to drop
    to before exec. A
    :class:`RunAsRefusal` means the member must not start here. Deterministic given
    ``lookup``; never raises.
    """
    if policy.mode is RunAsMode.AGENT:
        return None
    if not owner:
        # Nobody to switch to: the member would run as the agent itself, which is root.
        if policy.allow_root_members:
            return None
        return RunAsRefusal(RunAsRefusalCode.ROOT_REFUSED, policy.node_id, owner)
    name = policy.account_name(owner)
    mapped = dict(policy.user_map).get(owner, "")
    account = lookup(name)
    if account is None:
        return RunAsRefusal(RunAsRefusalCode.NO_ACCOUNT, policy.node_id, owner, mapped)
    if account.uid == 0 and not policy.allow_root_members:
        return RunAsRefusal(RunAsRefusalCode.ROOT_REFUSED, policy.node_id, owner, mapped)
    return account


def local_account(
    name: str,
    *,
    getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
    getgrouplist: Callable[[str, int], list[int]] = os.getgrouplist,
) -> Account | None:
    """The account ``name`` from the local account database (``/etc/passwd``, NSS), with
    its supplementary groups; None when there is no such account."""
    if not name or "\x00" in name:
        return None
    try:
        entry = getpwnam(name)
    except KeyError:
        return None
    try:
        groups = getgrouplist(entry.pw_name, entry.pw_gid)
    except OSError:
        groups = [entry.pw_gid]
    return Account(
        name=entry.pw_name,
        uid=entry.pw_uid,
        gid=entry.pw_gid,
        groups=tuple(sorted(set(groups) | {entry.pw_gid})),
        home=entry.pw_dir,
        shell=entry.pw_shell,
    )


def agent_user_name(
    uid: int | None = None, getpwuid: Callable[[int], pwd.struct_passwd] = pwd.getpwuid
) -> str:
    """The name of the account this process runs as (its uid as text when it has none)."""
    uid = os.geteuid() if uid is None else uid
    try:
        return getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def parse_user_map(entries: Mapping[str, object] | list[str]) -> tuple[tuple[str, str], ...]:
    """User-map entries from flags (``["alice=svc_alice", ...]``) or a TOML table
    (``{alice = "svc_alice"}``), sorted by owner. Raises ValueError naming a bad entry."""
    pairs: list[tuple[str, str]] = []
    if isinstance(entries, Mapping):
        for owner, account in entries.items():
            if not isinstance(account, str):
                raise ValueError(f"user_map: the account for {owner!r} must be a string")
            pairs.append((str(owner), account))
    else:
        for entry in entries:
            owner, sep, account = str(entry).partition("=")
            if not sep:
                raise ValueError(f"--user-map: {entry!r} is not OWNER=ACCOUNT")
            pairs.append((owner.strip(), account.strip()))
    seen: dict[str, str] = {}
    for owner, account in pairs:
        if not owner or not account or any(c.isspace() or c == ":" for c in owner + account):
            raise ValueError(
                f"user map: {owner}={account} needs a user and an account name, "
                "without spaces or ':'"
            )
        if owner in seen and seen[owner] != account:
            raise ValueError(f"user map: user {owner!r} maps to two accounts")
        seen[owner] = account
    return tuple(sorted(seen.items()))


def owner_environment(account: Account) -> dict[str, str]:
    """The variables that name the account a member runs as."""
    return {"HOME": account.home, "USER": account.name, "LOGNAME": account.name}
