"""Defaults and exit codes of ``synctl``."""

from __future__ import annotations

import enum

# gRPC addresses of the three replicas that ``synctl dev up`` starts.
DEFAULT_CLUSTER = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
CLUSTER_ENV = "SYNAPSE_CLUSTER"
# Where synctl finds its bearer token: --token-file, else this variable (the token's
# text), else the file ``synapse/token`` in the user's config directory
# ($XDG_CONFIG_HOME, default ~/.config).
TOKEN_ENV = "SYNAPSE_TOKEN"
TOKEN_FILE_ENV = "SYNAPSE_TOKEN_FILE"
TOKEN_FILE_NAME = "token"
# The TLS files synctl presents to the cluster: --ca/--cert/--key, else these variables,
# else these files in the same config directory (each one only when it exists). All three
# or none: without them synctl speaks plaintext, which a secure cluster refuses.
CA_ENV = "SYNAPSE_CA"
CERT_ENV = "SYNAPSE_CERT"
KEY_ENV = "SYNAPSE_KEY"
CA_FILE_NAME = "ca.pem"
CERT_FILE_NAME = "cert.pem"
KEY_FILE_NAME = "key.pem"
# Added to "cannot reach" errors when synctl spoke plaintext.
TLS_HINT = (
    f"the cluster may require TLS: set {CA_ENV}, {CERT_ENV}, {KEY_ENV} (synctl dev up prints them)"
)

# Seconds one command may spend finding the leader and getting an answer.
DEFAULT_TIMEOUT_S = 5.0
# Upper bound on one RPC attempt, so that a silent replica does not eat the whole budget.
PER_TRY_TIMEOUT_S = 2.0
# How often --wait and --follow ask for the job's state.
POLL_INTERVAL_S = 0.5


class ExitCode(enum.IntEnum):
    OK = 0
    JOB_FAILED = 1  # --wait: the job ended FAILED or CANCELLED; also any other error
    USAGE = 2  # bad options or arguments, or an invalid job spec
    UNREACHABLE = 3  # no replica (or worker) answered within --timeout
    NOT_FOUND = 4  # no such job or node
    DENIED = 5  # no credential, a refused one, or not allowed (UNAUTHENTICATED, PERMISSION_DENIED)
    INTERRUPTED = 130  # Ctrl-C
