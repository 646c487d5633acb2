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

from fa4verify.mutants import source as sm

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
    # the hangs: this one and the eleventh red-team round's varlen scheduler deadlock; the numeric
    # ones are judged by values
    assert [x.id for x in sm.CATALOGUE if x.hang] == [HANG, "varlen_lpt_block_order_dropped"]


class _Stop(Exception):
    """Raised where the campaign would start its workers: the copies asked for so far are the set."""


@pytest.mark.parametrize("argv,want", [([], False), (["--mutants", HANG], True)])
def test_the_detection_campaign_leaves_the_hang_out_unless_named(monkeypatch, tmp_path, argv, want):
    """``source_mutants_run`` judges values; a hang has none (its worker runs into the deadline),
    so its default set is the catalogue without it, and naming it still runs it."""
    from fa4verify.mutants import source_run as run
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
        assert seen[1:] == [m.id for m in sm.CATALOGUE if not m.hang]


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
    from fa4verify.compile.production import CompileCase as C, run_cases
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


def _audit_mutants_script():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "audit_mutants.py"
    spec = importlib.util.spec_from_file_location("audit_mutants_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("timeout,flag", [("60", ["--timeout", "60"]), ("default", [])])
def test_audit_mutants_passes_the_deadline_and_reports_the_hung_case_and_leftovers(
        monkeypatch, tmp_path, capsys, timeout, flag):
    """``scripts/audit_mutants.py`` (the lead's H200 command): ``--timeout default`` leaves the
    deadline to the engine (no ``--timeout`` passed), the line per mutant names the check the
    report has as ``error`` with its summary (the case that hung), and the engine processes
    still alive after the audit (here a planted one, then none)."""
    import json
    import subprocess
    mod = _audit_mutants_script()
    seen = {}

    def run(cmd, env=None, capture_output=True, text=True):
        seen["cmd"], seen["env"] = cmd, env
        rep = cmd[cmd.index("--json") + 1]
        summary = ("2/4 case(s) did not finish: case 1/4 (sm90 bf16 b1 s512/512 h2/2 d=64): "
                   "did not finish in 60 s (killed with its worker)")
        with open(rep, "w") as f:
            json.dump({"results": [{"id": "budgets.production.backward", "status": "error", "summary": summary},
                                   {"id": "budgets.production.forward", "status": "pass", "summary": "ok"}]}, f)
        return subprocess.CompletedProcess(cmd, 3, "", "")

    monkeypatch.setattr(mod.subprocess, "run", run)
    monkeypatch.setattr(sm, "make_copy", lambda m, dest, **kw: sm.PrivateCopy(m, dest, "f" * 64, "0" * 64))
    monkeypatch.setattr(mod, "_workers_alive", lambda: ["4242 python -P -m fa4verify.run.zygote"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("sys.argv", ["audit_mutants.py", "--out", str(tmp_path / "o"), "--checks",
                                     "budgets.production", "--timeout", timeout, HANG])
    assert mod.main() == 0
    cmd = seen["cmd"]
    assert cmd[cmd.index("-k") + 1] == "budgets.production"
    assert ("--timeout" in cmd) is bool(flag) and (not flag or cmd[cmd.index("--timeout") + 1] == "60")
    out = capsys.readouterr().out
    assert f"{HANG}: exit 3" in out and "budgets.production.backward=error" in out and "d=64" in out
    assert "budgets.production.forward" not in out                 # a passing check is not flagged
    assert "workers left: ['4242 python -P -m fa4verify.run.zygote']" in out
    rows = json.loads((tmp_path / "o" / "mutants.json").read_text())
    assert rows[0]["workers_left"] == ["4242 python -P -m fa4verify.run.zygote"]


def test_the_leftover_scan_sees_a_live_engine_process_and_not_a_finished_one(tmp_path):
    """``_workers_alive`` reads /proc: a process whose command line names the engine's worker
    module is listed while it lives, gone once it exited."""
    import subprocess
    import sys
    mod = _audit_mutants_script()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fa4verify.run.worker"])
    try:
        import time
        for _ in range(50):
            if any(x.startswith(f"{p.pid} ") for x in mod._workers_alive()):
                break
            time.sleep(0.1)
        assert any(x.startswith(f"{p.pid} ") for x in mod._workers_alive())
    finally:
        p.kill()
        p.wait()
    assert not any(x.startswith(f"{p.pid} ") for x in mod._workers_alive())


def test_a_mutant_is_judged_against_the_control_not_by_its_summary():
    """Measured on the H200 (e09f829): the clean run already failed on a plan row, so four
    mutants printed the clean run's summary; each had its own edge violating. Against the
    control, a mutant whose only finding is the control's is MISSED, one with a new edge (or
    more violating examples, or another check flagged) is CAUGHT."""
    mod = _audit_mutants_script()
    row94 = {"violating_rows": ["94"], "violating_edges": [], "violating_examples": 1}
    ctl = {"mutant": "clean", "flagged": ["coverage.production=fail: ... row 94"],
           "found": {"coverage.production": row94}}
    same = {"mutant": "m_same", "flagged": ["coverage.production=fail: ... row 94"],
            "found": {"coverage.production": dict(row94)}}
    edge = {"mutant": "m_edge", "flagged": ["coverage.production=fail: ... row 94"],
            "found": {"coverage.production": {"violating_rows": ["94"], "violating_edges": ["varlen_lookup_chunks"],
                                              "violating_examples": 2}}}
    other = {"mutant": "m_other", "flagged": ["coverage.production=fail: ... row 94", "fuzz.production=fail: x"],
             "found": {"coverage.production": dict(row94)}}
    rows = [ctl, same, edge, other]
    mod._against_control(rows)
    assert same["caught"] is False and same["new"] == []
    assert edge["caught"] is True and "coverage.production edge varlen_lookup_chunks" in edge["new"]
    assert other["caught"] is True and other["new"] == ["fuzz.production flagged"]
    assert "caught" not in ctl
    # a fuzz check: the same count on another problem is a new finding; a run without a report
    # is neither caught nor missed
    fz = {"mutant": "clean", "flagged": ["fuzz.production=fail: x"],
          "found": {"fuzz.production": {"violating_rows": [], "violating_edges": [], "violating_examples": 1,
                                        "first": "problem A"}}}
    moved = {"mutant": "m_moved", "flagged": ["fuzz.production=fail: y"],
             "found": {"fuzz.production": {"violating_rows": [], "violating_edges": [], "violating_examples": 1,
                                           "first": "problem B"}}}
    lost = {"mutant": "m_lost", "flagged": ["no report: missing"], "found": {}}
    mod._against_control([fz, moved, lost])
    assert moved["caught"] is True and "another problem" in moved["new"][0]
    assert lost["caught"] is None
    solo = [dict(same)]
    solo[0].pop("caught"), solo[0].pop("new")
    mod._against_control(solo)                 # no control: nothing is said
    assert "caught" not in solo[0]
