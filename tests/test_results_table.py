"""The README's results table (and the full one in docs/results/README.md) is generated from the
append-only evidence store docs/results/evidence.toml (fa4verify.tables.results) and current; every
entry names where it was obtained and raw evidence that exists."""
from __future__ import annotations

from pathlib import Path

import pytest

from fa4verify.tables import results as R

ROOT = Path(__file__).resolve().parents[1]


def test_every_entry_is_complete_and_its_source_exists():
    claims = R.load()
    assert len(claims) >= 20
    for c in claims:
        assert (ROOT / c["source"]).exists(), (c["id"], c["source"])
        assert R.WHERE.match(c["where"]), c["where"]
        assert ("measured on" in c["where"] or "recorded on" in c["where"]) == bool(c["gpu"]), c["id"]


def test_readme_and_results_readme_blocks_are_current():
    assert R.main(["--check", str(ROOT / "README.md")]) == 0
    assert R.main(["--check", str(ROOT / "docs" / "results" / "README.md"), "--all"]) == 0


def test_a_later_entry_replaces_the_figure_of_its_claim(tmp_path):
    store = tmp_path / "e.toml"
    row = ('[[claim]]\nid = "x"\nclaim = "c"\nfigure = "{f}"\nwhere = "measured on NVIDIA H200 (sm_90)"\n'
           'fa4 = "4.0.0b36"\ngpu = "NVIDIA H200"\ndate = "2026-12-0{d}"\ncommit = "abc"\nsource = "s"\n'
           'headline = true\n')
    store.write_text(row.format(f="old 1.0", d=1) + row.format(f="new 2.0", d=2))
    table = R.render(R.load(store))
    assert "new 2.0" in table and "old 1.0" not in table
    assert "**flash-attn-4 4.0.0b36**" in table and "measured on NVIDIA H200 (sm_90), 2026-12-02" in table


@pytest.mark.parametrize("bad,msg", [('where = "on my laptop"', "where label"),
                                     ('date = "yesterday"', "YYYY-MM-DD"),
                                     ('figure = "a | b"', "one line")])
def test_a_bad_entry_is_refused_with_its_id(tmp_path, bad, msg):
    base = {"id": '"x"', "claim": '"c"', "figure": '"f"', "where": '"CPU twin"', "fa4": '"v"',
            "gpu": '""', "date": '"2026-12-01"', "commit": '"abc"', "source": '"s"'}
    k = bad.split(" = ")[0]
    base[k] = bad.split(" = ", 1)[1]
    store = tmp_path / "e.toml"
    store.write_text("[[claim]]\n" + "".join(f"{a} = {b}\n" for a, b in base.items()))
    with pytest.raises(ValueError, match=msg):
        R.load(store)


def test_stale_block_is_detected(tmp_path):
    p = tmp_path / "R.md"
    p.write_text(f"x\n{R.START}\n| old |\n{R.END}\n")
    assert R.main(["--check", str(p)]) == 1
    assert R.main(["--write", str(p)]) == 0 and R.main(["--check", str(p)]) == 0


def test_the_readme_reads_in_ten_minutes():
    """Issue 27: the README is at most 150 lines (the generated tables included)."""
    import pathlib
    readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
    n = len(readme.read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines: move detail to docs/"
