"""Defaults and exit codes of ``synctl``."""

from __future__ import annotations

import enum

# Where synctl finds the cluster, its bearer token and its TLS files: the client
# library's rules (synapse_ha.client.credentials), shared with the Python client.
from synapse_ha.client.credentials import CA_ENV, CERT_ENV, KEY_ENV

# Added to "cannot reach" errors when synctl spoke plaintext.
TLS_HINT = (
    f"the cluster may require TLS: set {CA_ENV}, {CERT_ENV}, {KEY_ENV} (synctl dev env prints them)"
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
