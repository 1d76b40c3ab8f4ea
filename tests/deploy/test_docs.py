"""docs/security.md and the README's security section agree with the code they describe:
the policy table is the one every replica enforces, and the documented refusal without
TLS material is the message the programs give."""

from __future__ import annotations

from pathlib import Path

from synapse_ha.core.identity.access import POLICY, Audience, short_method
from synapse_ha.security.grants import GRANT_METADATA_KEY
from synapse_ha.security.tls import TlsError, tls_settings

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "docs" / "security.md"
COLUMNS = ("admin", "operator", "user", "replica", "worker")


def documented_policy() -> dict[str, frozenset[Audience]]:
    """The "Who may call what" table: a cell other than "—" allows (possibly narrowed)."""
    lines = SECURITY.read_text().splitlines()
    header = "| method | " + " | ".join(COLUMNS) + " |"
    start = lines.index(header) + 2  # the header and its separator row
    table: dict[str, frozenset[Audience]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        method, marks = cells[0].strip("`"), cells[1:]
        assert len(marks) == len(COLUMNS), line
        table[method] = frozenset(
            Audience(c) for c, m in zip(COLUMNS, marks, strict=True) if m != "—"
        )
    return table


def test_the_documented_policy_is_the_enforced_one() -> None:
    enforced = {short_method(method): allowed for method, allowed in POLICY.items()}
    assert documented_policy() == enforced


def test_the_documented_refusal_without_tls_is_what_the_programs_say() -> None:
    try:
        tls_settings("", "", "", insecure=False)
    except TlsError as exc:
        message = str(exc)
    else:
        raise AssertionError("tls_settings accepted no TLS material")
    assert message.startswith("no TLS material (--tls-ca, --tls-cert, --tls-key not given)")
    deploy_readme = " ".join((ROOT / "deploy" / "README.md").read_text().split())
    assert "no TLS material (--tls-ca, --tls-cert, --tls-key not given)" in deploy_readme


def test_the_security_docs_name_the_grant_metadata_and_the_insecure_flag() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Security") : readme.index("## Known limits")]
    assert "--insecure" in section
    assert "docs/security.md" in section
    assert "no authentication or TLS" not in readme.lower()
    assert f"`{GRANT_METADATA_KEY}`" in SECURITY.read_text()
