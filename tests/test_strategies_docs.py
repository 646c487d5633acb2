"""docs/fuzzing.md lists exactly the public names of fa4verify.strategies."""
from __future__ import annotations

import re
from pathlib import Path

import fa4verify.strategies as S

DOC = Path(__file__).resolve().parent.parent / "docs" / "fuzzing.md"


def test_docs_list_every_public_strategy_name():
    text = DOC.read_text()
    block = text.split("Public names (`fa4verify.strategies.__all__`", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", block)) - {"fa4verify"}
    assert listed == set(S.__all__), (listed ^ set(S.__all__))


def test_docs_name_every_property_and_profile():
    from fa4verify import fuzz
    text = DOC.read_text()
    for p in fuzz.PROPERTIES:
        assert f"`{p}`" in text, p
    for prof in fuzz.PROFILES:
        assert f"`{prof}`" in text, prof
    for ki in fuzz.KNOWN_ISSUES:
        assert f"`{ki.name}`" in text, ki.name
