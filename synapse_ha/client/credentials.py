"""Where a client finds the cluster and its credentials, the same way for synctl and
the Python client (:class:`synapse_ha.client.Cluster`), first match wins:

* the replicas' addresses: given (synctl's ``--cluster``), else ``$SYNAPSE_CLUSTER``,
  else the cluster of a running ``synctl dev up`` (its *dev profile*, below), else the
  three replicas of ``synctl dev up`` on their default ports (:data:`DEFAULT_CLUSTER`);
* the bearer token: a given token file (synctl's ``--token-file``, else
  ``$SYNAPSE_TOKEN_FILE``), else ``$SYNAPSE_TOKEN`` (the token's text), else the dev
  profile's admin token when the addresses are the dev cluster's, else ``token`` in the
  config directory when it exists;
* the TLS files (all three or none; none means plaintext, which a secure cluster
  refuses): each one given, else ``$SYNAPSE_CA``/``$SYNAPSE_CERT``/``$SYNAPSE_KEY``, else
  the dev profile's when the addresses are the dev cluster's, else
  ``ca.pem``/``cert.pem``/``key.pem`` in the config directory when that file exists.

The config directory is ``$XDG_CONFIG_HOME/synapse``, or ``~/.config/synapse``.

The dev profile (``dev-cluster.json`` there, mode 0600) is written by ``synctl dev up``
once its cluster serves and removed when it stops: the cluster's addresses and the paths
of its CA, client certificate, key and admin token file, and the process id of the
``synctl dev up`` that wrote it. A profile whose process is gone (killed without a
chance to remove it) or whose files are gone is stale and ignored
(:func:`read_dev_profile`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from synapse_ha.security.tls import TlsError, TlsFiles, Transport

# gRPC addresses of the three replicas that ``synctl dev up`` starts.
DEFAULT_CLUSTER = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
CLUSTER_ENV = "SYNAPSE_CLUSTER"
TOKEN_ENV = "SYNAPSE_TOKEN"
TOKEN_FILE_ENV = "SYNAPSE_TOKEN_FILE"
TOKEN_FILE_NAME = "token"
CA_ENV = "SYNAPSE_CA"
CERT_ENV = "SYNAPSE_CERT"
KEY_ENV = "SYNAPSE_KEY"
CA_FILE_NAME = "ca.pem"
CERT_FILE_NAME = "cert.pem"
KEY_FILE_NAME = "key.pem"
DEV_PROFILE_NAME = "dev-cluster.json"
# Every variable that points a client at a cluster (what `synctl dev env` sets or unsets).
CLIENT_ENV = (CLUSTER_ENV, CA_ENV, CERT_ENV, KEY_ENV, TOKEN_FILE_ENV, TOKEN_ENV)


class CredentialsError(ValueError):
    """The credentials found cannot be used: the message says which file or setting and
    why."""


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/synapse``, or ``~/.config/synapse``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "synapse"


def default_token_file(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/synapse/token``, or ``~/.config/synapse/token``."""
    return config_dir(environ) / TOKEN_FILE_NAME


def find_tls(
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    environ: Mapping[str, str] | None = None,
    *,
    dev: DevProfile | None = None,
) -> TlsFiles | None:
    """The TLS files synctl presents: each one as given (``--ca``/``--cert``/``--key``,
    which click also fills from ``$SYNAPSE_CA``/``$SYNAPSE_CERT``/``$SYNAPSE_KEY``), else
    the ``dev`` profile's (the cluster's addresses are a running dev cluster's; none for
    an insecure one), else ``ca.pem``/``cert.pem``/``key.pem`` in the config directory
    when that file exists. None when none of the three is found (plaintext). Raises
    :class:`CredentialsError` when only some are found, naming the missing ones, or when
    the files cannot be read or the key is not the certificate's."""
    folder = config_dir(environ)
    defaults: tuple[Path | None, ...]
    if dev is not None:
        defaults = (
            (None, None, None) if dev.tls is None else (dev.tls.ca, dev.tls.cert, dev.tls.key)
        )
    else:
        names = (CA_FILE_NAME, CERT_FILE_NAME, KEY_FILE_NAME)
        defaults = tuple(folder / n if (folder / n).is_file() else None for n in names)
    found: dict[str, Path | None] = {}
    for (flag, env), given, default in zip(
        (("--ca", CA_ENV), ("--cert", CERT_ENV), ("--key", KEY_ENV)),
        (ca, cert, key),
        defaults,
        strict=True,
    ):
        found[f"{flag} (${env})"] = given or default
    missing = [what for what, path in found.items() if path is None]
    if len(missing) == len(found):
        return None
    if missing:
        raise CredentialsError(
            f"incomplete TLS settings: {', '.join(missing)} not given; mutual TLS needs the "
            f"cluster CA, a client certificate and its key (or none of them, for an "
            f"--insecure cluster). Defaults: {CA_FILE_NAME}, {CERT_FILE_NAME}, "
            f"{KEY_FILE_NAME} in {folder}"
        )
    ca_file, cert_file, key_file = found.values()
    assert ca_file is not None and cert_file is not None and key_file is not None
    tls = TlsFiles(ca=ca_file, cert=cert_file, key=key_file)
    try:
        Transport(tls).material()
    except TlsError as exc:
        raise CredentialsError(str(exc)) from exc
    return tls


def find_token(
    token_file: Path | None,
    environ: Mapping[str, str] | None = None,
    *,
    dev: DevProfile | None = None,
) -> str | None:
    """The bearer token synctl sends: from ``token_file`` (given: it must be readable),
    else ``$SYNAPSE_TOKEN``, else the ``dev`` profile's token file (the cluster is a
    running dev cluster; none for an insecure one), else the default token file when it
    exists; None without one. Raises :class:`CredentialsError` for a given file that
    cannot be read."""
    env = os.environ if environ is None else environ
    if token_file is None:
        text = env.get(TOKEN_ENV, "").strip()
        if text:
            return text
        token_file = default_token_file(env) if dev is None else dev.token_file
        if token_file is None or not token_file.is_file():
            return None
    try:
        text = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CredentialsError(f"cannot read the token file {token_file}: {exc.strerror}") from exc
    return text or None


def parse_cluster(value: str) -> list[str]:
    """``host:port,host:port,...`` into a list; raises :class:`ValueError` naming the
    address that is not ``host:port``."""
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    if not addresses:
        raise ValueError("no address given (expected host:port,host:port,...)")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{address!r} is not host:port")
    return addresses


# ------------------------------------------------------------------ the dev profile


@dataclass(frozen=True)
class DevProfile:
    """What ``synctl dev up`` tells clients about the cluster it runs: its replicas'
    addresses, the TLS files and admin token file a client uses (None: an insecure
    cluster), and the process id of that ``synctl dev up``."""

    cluster: str
    pid: int
    tls: TlsFiles | None = None
    token_file: Path | None = None

    @property
    def addresses(self) -> list[str]:
        return parse_cluster(self.cluster)

    def exports(self) -> list[str]:
        """Shell lines (for ``eval``) that point a client at this cluster as its admin,
        unsetting the variables it does not need, so that none left from another
        cluster wins over them."""
        values = {CLUSTER_ENV: self.cluster}
        if self.tls is not None:
            values |= {CA_ENV: str(self.tls.ca), CERT_ENV: str(self.tls.cert)}
            values[KEY_ENV] = str(self.tls.key)
        if self.token_file is not None:
            values[TOKEN_FILE_ENV] = str(self.token_file)
        lines = [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
        unset = [name for name in CLIENT_ENV if name not in values]
        return [*lines, f"unset {' '.join(unset)}"] if unset else lines

    def to_json(self) -> str:
        document: dict[str, object] = {"cluster": self.cluster, "pid": self.pid}
        if self.tls is not None:
            files = {"ca": self.tls.ca, "cert": self.tls.cert, "key": self.tls.key}
            document["tls"] = {name: str(path) for name, path in files.items()}
        if self.token_file is not None:
            document["token_file"] = str(self.token_file)
        return json.dumps(document, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DevProfile:
        """Raises ValueError (or KeyError, TypeError) for a document that is not one."""
        document = json.loads(text)
        tls = document.get("tls")
        token_file = document.get("token_file")
        profile = cls(
            cluster=str(document["cluster"]),
            pid=int(document["pid"]),
            tls=None
            if tls is None
            else TlsFiles(Path(tls["ca"]), Path(tls["cert"]), Path(tls["key"])),
            token_file=None if token_file is None else Path(token_file),
        )
        parse_cluster(profile.cluster)
        return profile

    def live(self) -> bool:
        """Its ``synctl dev up`` still runs and its files are all there."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone's process: alive
        files = [] if self.tls is None else [self.tls.ca, self.tls.cert, self.tls.key]
        files += [] if self.token_file is None else [self.token_file]
        return all(f.is_file() for f in files)


def dev_profile_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/synapse/dev-cluster.json``, or ``~/.config/synapse/...``."""
    return config_dir(environ) / DEV_PROFILE_NAME


def read_dev_profile(environ: Mapping[str, str] | None = None) -> DevProfile | None:
    """The profile of the ``synctl dev up`` running now; None when there is none, or
    it cannot be read, or it is stale (:meth:`DevProfile.live`)."""
    try:
        profile = DevProfile.from_json(dev_profile_path(environ).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return profile if profile.live() else None


def write_dev_profile(profile: DevProfile, environ: Mapping[str, str] | None = None) -> Path:
    """Write ``profile`` where clients look for it (mode 0600, the directory 0700 when
    made here), replacing any other at once (never half-written); its path."""
    path = dev_profile_path(environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".dev-cluster-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp makes it 0600
            out.write(profile.to_json())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def remove_dev_profile(pid: int, environ: Mapping[str, str] | None = None) -> None:
    """Remove the profile if process ``pid`` wrote it (another one's is left alone)."""
    path = dev_profile_path(environ)
    try:
        mine = DevProfile.from_json(path.read_text(encoding="utf-8")).pid == pid
    except (OSError, ValueError, KeyError, TypeError):
        return
    if mine:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# ------------------------------------------------------------------ discovery


@dataclass(frozen=True)
class Found:
    """Where a client goes and what it presents; ``dev``: the running dev cluster whose
    profile gave the addresses or the credentials (None: it gave nothing)."""

    addresses: list[str]
    token: str | None
    tls: TlsFiles | None
    dev: DevProfile | None


def discover(
    cluster: str | Sequence[str] | None = None,
    *,
    token_file: Path | None = None,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Found:
    """The addresses, token and TLS files by the rules of this module, from what is
    given, the environment, the dev profile and the config directory. Raises
    :class:`CredentialsError` (credentials that cannot be used) or ValueError (an
    address that is not ``host:port``)."""
    env = os.environ if environ is None else environ
    given = cluster or env.get(CLUSTER_ENV) or None
    dev = read_dev_profile(env)
    if given is None:
        addresses = dev.addresses if dev is not None else parse_cluster(DEFAULT_CLUSTER)
    else:
        addresses = parse_cluster(given) if isinstance(given, str) else list(given)
        if dev is not None and set(addresses) != set(dev.addresses):
            dev = None  # another cluster: the dev cluster's credentials are not for it
    if token_file is None and env.get(TOKEN_FILE_ENV):
        token_file = Path(env[TOKEN_FILE_ENV])
    ca, cert, key = (
        given_path or (Path(env[name]) if env.get(name) else None)
        for given_path, name in ((ca, CA_ENV), (cert, CERT_ENV), (key, KEY_ENV))
    )
    token = find_token(token_file, env, dev=dev)
    tls = find_tls(ca, cert, key, env, dev=dev)
    return Found(addresses=addresses, token=token, tls=tls, dev=dev)
