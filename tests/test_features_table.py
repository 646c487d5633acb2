"""The feature x arch support table (kernels/features.py) against the installed FA4 source."""
from __future__ import annotations

import pytest

from fa4verify.kernels import features as F


def _fa4_installed() -> bool:
    try:
        F.fa4_source()
        return True
    except (ImportError, FileNotFoundError):
        return False


needs_fa4 = pytest.mark.skipif(not _fa4_installed(), reason="flash_attn.cute (flash-attn-4) not installed")


def test_every_feature_has_a_cell_per_arch_and_direction():
    keys = [(c.feature, c.arch, c.direction) for c in F.SUPPORT]
    assert len(keys) == len(set(keys)), "duplicate cells"
    want = {(f, a, d) for f in F.FEATURES for a in F.ARCHS for d in F.DIRECTIONS}
    assert set(keys) == want


def test_every_cell_names_evidence():
    for c in F.SUPPORT:
        assert c.evidence, c
        assert c.status in ("supported", "not supported", "n/a")


@needs_fa4
@pytest.mark.parametrize("c", F.SUPPORT, ids=lambda c: f"{c.feature}-{c.arch}-{c.direction}")
def test_cell_evidence_is_in_installed_fa4_source(c):
    where = F.check_evidence(c)
    assert len(where) == len(c.evidence)


def test_missing_quote_is_an_evidence_error():
    c = F.cell("split_kv", "sm90", "fwd")
    with pytest.raises(F.EvidenceError, match="does not contain"):
        F.check_evidence(c, sources={"interface.py": "def unrelated():\n    pass\n"})


def test_signature_finding_that_flips_is_an_evidence_error():
    c = F.cell("paged_kv", "sm90", "bwd")     # evidence: _flash_attn_bwd has no page_table
    with pytest.raises(F.EvidenceError, match="has parameter 'page_table'"):
        F.check_evidence(c, signature_of=lambda fn: ["q", "k", "v", "page_table"])
    assert F.check_evidence(c, signature_of=lambda fn: ["q", "k", "v"]) == ["_flash_attn_bwd has no page_table"]


def test_sm90_claims_match_the_issue_table():
    # issue 16's table, read from interface.py by hand; a disagreement must be resolved in one place
    exp = {("split_kv", "fwd"): "not supported", ("paged_kv", "fwd"): "supported",
           ("paged_kv", "bwd"): "not supported", ("fp8", "fwd"): "not supported",
           ("mla", "fwd"): "not supported", ("block_sparse", "bwd"): "supported"}
    for (f, d), s in exp.items():
        assert F.cell(f, "sm90", d).status == s, (f, d)
    assert F.cell("split_kv", "sm100", "fwd").status == "supported"
    assert F.cell("fp8", "sm100", "fwd").status == "supported"
