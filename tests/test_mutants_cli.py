"""``fa4verify mutants`` as a user runs it: options, exit codes, the table, JSON and markdown."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fa4verify import mutants as M
from fa4verify.cli import main
from fa4verify.cli.mutants import command


def _needs_twin():
    tw = M.twin_module()
    assert not (tw is None or getattr(tw, "backward", None) is None), "fa4verify.kernels.twin.attention (forward and backward) failed to load (fa4verify's own module)"


def test_list_names_every_mutant_and_verifier():
    r = CliRunner().invoke(command, ["--list"], standalone_mode=False)
    assert r.exception is None, r.output
    for name in M.MUTANT_NAMES:
        assert name in r.output
    for s in M.verifiers():
        assert s.name in r.output


@pytest.mark.parametrize("args", [["--mutant", "nope"], ["--verifier", "nope"],
                                  ["--profile", "huge"], ["--arch", "sm80"],
                                  ["--from-json", "nope.json"]])
def test_bad_options_exit_2_with_one_line(args, capsys):
    rc = main(["mutants", *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert any(x in err for x in ("nope", "huge", "sm80")), err


def test_production_target_without_gpu_is_a_usage_error(capsys, no_cuda):
    rc = main(["mutants", "--target", "production", "-q"])
    assert rc == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_one_mutant_one_problem_table_json_markdown(tmp_path, monkeypatch):
    """A small run end to end: the table prints, JSON and markdown are written, the exit code
    says whether fa4verify caught the mutant (rescale_skipped on the peaked problem: caught)."""
    _needs_twin()
    peaked = next(p for p in M.battery("quick") if p.name == "peaked_rescale")
    monkeypatch.setattr(M.suite, "battery", lambda profile="quick": (peaked,))
    js, md = tmp_path / "m.json", tmp_path / "m.md"
    rc = main(["mutants", "--mutant", "rescale_skipped", "--arch", "sm90", "-q",
               "--json", str(js), "--markdown", str(md)])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["schema"] == "fa4verify.mutants/1" and data["where"] == "CPU twin"
    cell = data["table"]["rescale_skipped"]
    assert cell["fa4verify"]["status"] == "caught"
    assert cell["fa_rule_fwd"]["status"] in ("caught", "missed", "false-alarm")
    assert set(data["false_alarms"]) >= {"fwd_budget", "fa_rule_fwd", "assert_close_fwd"}
    assert all(not v for k, v in data["false_alarms"].items()
               if k in ("fwd_budget", "bwd_budget", "stages", "determinism"))
    text = md.read_text()
    assert "fa4verify mutants --profile quick --seed 0 --arch sm90 --mutant rescale_skipped" in text
    assert "| rescale_skipped | CAUGHT" in text
    # the saved JSON renders the same table again
    md2 = tmp_path / "again.md"
    assert main(["mutants", "--from-json", str(js), "--markdown", str(md2)]) == 0
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table and table == [ln for ln in md2.read_text().splitlines() if ln.startswith("|")]



def test_exit_code_is_1_when_fa4verify_misses(tmp_path, monkeypatch):
    """A mutant that no battery problem exposes is a miss: exit code 1 (not a pass)."""
    _needs_twin()
    small = M.Problem("no_tail", 16, 128, note="no partial KV tile: tail_tile_dropped is inert")
    monkeypatch.setattr(M.suite, "battery", lambda profile="quick": (small,))
    rc = main(["mutants", "--mutant", "tail_tile_dropped", "--arch", "sm90", "-q",
               "--verifier", "fwd_budget"])
    assert rc == 1


def test_source_dir_needs_the_production_target(tmp_path, capsys):
    from fa4verify.cli import main
    code = main(["mutants", "--source-dir", str(tmp_path), "--list"])
    err = capsys.readouterr().err
    assert code == 2 and "only with --target production" in err and "Traceback" not in err


def test_a_source_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    from fa4verify.cli import main
    f = tmp_path / "f"
    f.write_text("keep")
    code = main(["mutants", "--target", "production", "--source-dir", str(f), "--list"])
    assert code == 2 and "is not a directory" in capsys.readouterr().err
    assert f.read_text() == "keep"


def test_every_verifier_says_what_it_can_judge_and_the_production_column_follows():
    from fa4verify import mutants as M
    from fa4verify.mutants.production import PRODUCTION_VERIFIERS
    judges = {s.name: s.judges for s in M.verifiers()}
    assert set(judges.values()) <= {"production", "twin only", "bit comparison"}
    assert judges["stages"] == "twin only" and judges["exp2_golden"] == "bit comparison"
    assert judges["fwd_budget"] == judges["statistical"] == "production"
    assert set(PRODUCTION_VERIFIERS) == {n for n, j in judges.items() if j == "production"}
