"""A member of an sbatch job as its environment describes it (DESIGN §5's variables and
the job's step secret): its rank, the allocation's hosts, its attempt's token, and where
the first node's step hub listens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from synapse_ha.slurm import wire


@dataclass(frozen=True, slots=True)
class Member:
    """This member as its environment describes it (DESIGN §5's variables)."""

    job_id: str
    rank: int
    hosts: tuple[str, ...]
    token: int
    hub: tuple[str, int]
    secret: bytes

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Member:
        try:
            hosts = tuple(h for h in env["SYNAPSE_MEMBER_HOSTS"].split(",") if h)
            port = wire.step_port(int(env["MASTER_PORT"]))
            return cls(
                job_id=env["SYNAPSE_JOB_ID"],
                rank=int(env["RANK"]),
                hosts=hosts,
                token=int(env["SYNAPSE_FENCING_TOKEN"]),
                hub=(hosts[0] if hosts else env["MASTER_ADDR"], port),
                secret=env[wire.SECRET_ENV].encode(),
            )
        except (KeyError, ValueError, IndexError) as exc:
            raise SystemExit(f"stepd: not run as a member of an sbatch job ({exc})") from None
