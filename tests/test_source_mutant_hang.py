"""The planted kernel hang (Note [Planted hang], ``sm90_bwd_hd64_hang``) on the CPU: its edit
applies to the installed FA4 exactly once, the detection campaign leaves it out unless named, and
compiled for sm_90a (compile-only, the private copy first on PYTHONPATH) the SM90 backward at head
dim 64 carries a device-side loop on ``%clock64`` that branches back to itself, while the same
copy at head dim 128 compiles the loop away (the hang is selective). What the audit makes of it
on the H200 is the lead's run (the command is in the issue-30 report).

Measured here (2-core CPU box, FA4 4.0.0b36, DSL 4.8.1; compile-only): one compile subprocess
per head dim, about 11 s each idle.
"""
from __future__ import annotations

import re

import pytest

from fa4verify import source_mutants as sm

pytestmark = pytest.mark.fa4

HANG = "sm90_bwd_hd64_hang"


def test_the_hang_is_in_the_catalogue_and_applies_once_to_the_installed_source():
    m = sm.catalogue([HANG])[0]
    assert m.hang and m.stage == "bwd" and m.to_dict()["hang"] is True
    (e,) = m.edits
    text = (sm.installed_root() / "cute" / e.file).read_text()
    assert text.count(e.old) == 1
    new = sm.apply_edits(text, m.edits, e.file)
    assert new.count("cute.arch.clock64()") == text.count("cute.arch.clock64()") + 2
    # only this mutant hangs: the numeric ones are judged by values
    assert [x.id for x in sm.CATALOGUE if x.hang] == [HANG]


class _Stop(Exception):
    """Raised where the campaign would start its workers: the copies asked for so far are the set."""


@pytest.mark.parametrize("argv,want", [([], False), (["--mutants", HANG], True)])
def test_the_detection_campaign_leaves_the_hang_out_unless_named(monkeypatch, tmp_path, argv, want):
    """``source_mutants_run`` judges values; a hang has none (its worker runs into the deadline),
    so its default set is the catalogue without it, and naming it still runs it."""
    from fa4verify import source_mutants_run as run
    from fa4verify.run import engine
    seen: list = []

    def make_copy(m, dest, **kw):
        seen.append(None if m is None else m.id)
        return sm.PrivateCopy(m, dest, "0" * 64, "0" * 64)

    def run_calls(*a, **kw):
        raise _Stop

    monkeypatch.setattr(run.sm, "make_copy", make_copy)
    monkeypatch.setattr(engine, "run_calls", run_calls)
    with pytest.raises(_Stop):
        run.main(["--out", str(tmp_path / "o"), "--device", "cpu", "--work", str(tmp_path / "w"), *argv])
    assert seen[0] is None                                   # the control first
    assert (HANG in seen) is want
    if not want:
        assert seen[1:] == [m.id for m in sm.CATALOGUE if m.id != HANG]


def _ptx_loops_on_clock(dump) -> tuple[int, int]:
    """(reads of %clock64, self-branching blocks that read it) in the SM90 backward kernel's PTX."""
    (ptx,) = [p for p in dump.iterdir() if p.suffix == ".ptx" and "FlashAttentionBackwardSm90" in p.name]
    text = ptx.read_text()
    loops = 0
    for m in re.finditer(r"^(\$L__BB\d+_\d+):\n((?:\t[^\n]*\n)+)", text, re.M):
        label, block = m.group(1), m.group(2)          # the block: its lines up to the next label
        if "%clock64" in block and re.search(rf"bra\s+{re.escape(label)};", block):
            loops += 1
    return text.count("%clock64"), loops


@pytest.mark.slow
def test_the_hang_compiles_to_a_device_loop_at_head_dim_64_only(tmp_path, monkeypatch):
    """Compile-only for sm_90a with the planted copy first on PYTHONPATH: the backward at head dim
    64 has a block that reads the SM clock and branches to itself (the spin: device code, kept by
    the compiler), at head dim 128 none; both compile (a broken edit would be a DSL error here,
    not a GPU run lost)."""
    from fa4verify.compile_only import CompileCase as C, run_cases
    copy = sm.make_copy(sm.catalogue([HANG])[0], tmp_path / "copy")
    monkeypatch.setenv("PYTHONPATH", str(copy.path))
    got = {}
    for hd in (64, 128):
        run = run_cases("sm_90a", [C("backward", hd, False, deterministic=True)], tmp_path / f"hd{hd}")
        (r,) = run["results"]
        assert r["ok"], r["error"]
        assert "FlashAttentionBackwardSm90" in r["kernels"]
        got[hd] = _ptx_loops_on_clock(tmp_path / f"hd{hd}" / "sm_90a-dump")
    assert got[64][1] >= 1 and got[64][0] >= 1, got
    assert got[128] == (0, 0), got
