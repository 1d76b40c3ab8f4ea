"""Where a client finds the cluster and its credentials, the same way for synctl and
the Python client (:class:`synapse_ha.client.Cluster`):

* the replicas' addresses: given, else ``$SYNAPSE_CLUSTER``, else the three replicas of
  ``synctl dev up`` (:data:`DEFAULT_CLUSTER`);
* the bearer token: a given token file (synctl's ``--token-file``, else
  ``$SYNAPSE_TOKEN_FILE``), else ``$SYNAPSE_TOKEN`` (the token's text), else ``token`` in
  the config directory when it exists;
* the TLS files (all three or none; none means plaintext, which a secure cluster
  refuses): each one given, else ``$SYNAPSE_CA``/``$SYNAPSE_CERT``/``$SYNAPSE_KEY``, else
  ``ca.pem``/``cert.pem``/``key.pem`` in the config directory when that file exists.

The config directory is ``$XDG_CONFIG_HOME/synapse``, or ``~/.config/synapse``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
    ca: Path | None, cert: Path | None, key: Path | None, environ: Mapping[str, str] | None = None
) -> TlsFiles | None:
    """The TLS files synctl presents: each one as given (``--ca``/``--cert``/``--key``,
    which click also fills from ``$SYNAPSE_CA``/``$SYNAPSE_CERT``/``$SYNAPSE_KEY``), else
    ``ca.pem``/``cert.pem``/``key.pem`` in the config directory when that file exists.
    None when none of the three is found (plaintext). Raises :class:`CredentialsError`
    when only some are found, naming the missing ones, or when the files cannot
    be read or the key is not the certificate's."""
    folder = config_dir(environ)
    found: dict[str, Path | None] = {}
    for (flag, env, name), given in zip(
        (
            ("--ca", CA_ENV, CA_FILE_NAME),
            ("--cert", CERT_ENV, CERT_FILE_NAME),
            ("--key", KEY_ENV, KEY_FILE_NAME),
        ),
        (ca, cert, key),
        strict=True,
    ):
        default = folder / name
        found[f"{flag} (${env})"] = given or (default if default.is_file() else None)
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
    files = TlsFiles(ca=ca_file, cert=cert_file, key=key_file)
    try:
        Transport(files).material()
    except TlsError as exc:
        raise CredentialsError(str(exc)) from exc
    return files


def find_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token synctl sends: from ``token_file`` (given: it must be readable),
    else ``$SYNAPSE_TOKEN``, else the default token file when it exists; None without
    one. Raises :class:`CredentialsError` for a given file that cannot be read."""
    env = os.environ if environ is None else environ
    if token_file is None:
        text = env.get(TOKEN_ENV, "").strip()
        if text:
            return text
        token_file = default_token_file(env)
        if not token_file.is_file():
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
