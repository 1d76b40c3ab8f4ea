"""Job-spec fields that are one value each, declared once: the document's key, the spec's
field, how the document writes the value and the rule the spec's value keeps.

:func:`synapse_ha.core.spec.document.parse_job_spec` reads each of :data:`SPEC_FIELDS` from a
document, and :func:`synapse_ha.core.spec.validation.check_job_spec` checks each rule, on a
spec from a document and on one from the API alike. A field whose value is a single
scalar is added here, not to the parser and the rule set apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

MAX_STOP_GRACE_MS = 3600 * 1000
_ACCOUNT = re.compile(r"[A-Za-z0-9_.@+-]{0,64}")  # six@v100: sites write accounts so


@dataclass(frozen=True, slots=True)
class SpecField:
    key: str  # the document's key
    attr: str  # the field of JobSpec
    # How the document writes it (synapse_ha.core.spec.document reads each kind): "duration" (10s,
    # 5m; milliseconds in the spec), "text" (a string as it is).
    kind: Literal["duration", "text"]
    rule: Callable[[Any], str]  # the spec's value: "" when it keeps the rule, else the rule


def _stop_grace_rule(ms: int) -> str:
    return "" if 0 <= ms <= MAX_STOP_GRACE_MS else "must be between 0 (the node's) and 1h"


def _account_rule(text: str) -> str:
    if _ACCOUNT.fullmatch(text):
        return ""
    return "letters, digits, '_', '.', '@', '+' and '-', at most 64 characters"


SPEC_FIELDS: tuple[SpecField, ...] = (
    # How long a member has between SIGTERM and SIGKILL when it is stopped (cancelled, no
    # longer desired, at its time limit); 0: the node's ``stop_grace``. Preemption gives
    # its priority class's grace, and a node that lost its lease its fence grace.
    SpecField("stop_grace", "stop_grace_ms", "duration", _stop_grace_rule),
    # An accounting label (sbatch --account), shown with the job; it changes no placement.
    SpecField("account", "account", "text", _account_rule),
)


def spec_field_problems(spec: object) -> list[tuple[str, str]]:
    """``(key, rule)`` for each rule of :data:`SPEC_FIELDS` ``spec`` (a JobSpec) breaks."""
    found = ((f.key, f.rule(getattr(spec, f.attr))) for f in SPEC_FIELDS)
    return [(key, rule) for key, rule in found if rule]
