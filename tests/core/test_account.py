"""A job's account: an accounting label (sbatch --account) read from a document or the
API alike, kept by its rule, carried over the wire, and needing its format only when set."""

from __future__ import annotations

import pytest

from synapse_ha.core import commands as cmd
from synapse_ha.core.codec import formats
from synapse_ha.core.spec.document import SpecError, parse_job_spec
from synapse_ha.core.spec.validation import check_job_spec
from synapse_ha.rpc.from_proto import spec_from_proto
from synapse_ha.rpc.to_proto import spec_to_proto

DOC = {"name": "train", "replicas": 1, "command": "true"}


def test_a_document_states_it_and_the_rule_bounds_it() -> None:
    for good in ("proj_1.a-b", "six@v100"):
        assert parse_job_spec({**DOC, "account": good}).spec.account == good
    assert parse_job_spec(DOC).spec.account == ""
    for bad in ("a b", "x" * 65, "é", "a;b"):
        with pytest.raises(SpecError, match="account: letters, digits"):
            parse_job_spec({**DOC, "account": bad})
    with pytest.raises(SpecError, match="account: expected a string"):
        parse_job_spec({**DOC, "account": 7})
    wire = spec_to_proto(parse_job_spec({**DOC, "account": "p1"}).spec)
    assert wire.account == "p1" and spec_from_proto(wire).account == "p1"
    wire.account = "no spaces allowed"
    assert [v.field for v in check_job_spec(spec_from_proto(wire), None)] == ["account"]


def test_it_needs_its_format_only_when_set() -> None:
    plain = parse_job_spec(DOC).spec
    labelled = parse_job_spec({**DOC, "account": "p1"}).spec
    assert formats.format_needed(cmd.SubmitJob(plain, "r1")) < 12
    assert formats.format_needed(cmd.SubmitJob(labelled, "r1")) == 12
