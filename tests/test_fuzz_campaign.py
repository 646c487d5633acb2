"""Campaigns and the ``fa4verify fuzz`` CLI: the CI profile on the CPU twin, JSON output,
replayable cases, exit codes, cache directories."""
from __future__ import annotations

import importlib
import json
import os

import pytest
from click.testing import CliRunner

from fa4verify import fuzz

importlib.import_module("fa4verify.kernels.twin.attention")


def _deps():
    import fa4verify.oracles.attention  # noqa: F401
    fuzz._budget(fuzz.AttentionProblem("sm90", "bf16", 1, 1, 1, 1, 1, 8, 8))


def _cli(args, tmp_path):
    from fa4verify.cli import cli
    runner = CliRunner()
    return runner.invoke(cli, ["fuzz", "--cache-dir", str(tmp_path / "cache")] + args, catch_exceptions=False)


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_ci_profile_on_the_twin_passes_every_property(arch, tmp_path):
    _deps()
    res = fuzz.run_campaign(target=fuzz.TwinTarget(), arch=arch, examples=40, seed=0, profile="ci",
                            cases_dir=tmp_path / "cases")
    assert not res.found, res.failure and (res.failure["message"] + "\n" + res.failure["snippet"])
    assert res.examples_run >= 30
    for p in ("runs", "masked_rows", "finite", "fwd_budget", "bwd_budget"):
        assert res.properties_ran.get(p, 0) >= 30, (p, res.properties_ran)
    assert 0 < res.max_metrics["tightness_max"] <= 1
    cov = res.coverage
    for feat in ("causal", "varlen", "sink", "softcap", "gqa", "seqlen_q_ne_k"):
        assert cov[feat].get("True", 0) > 0, (feat, cov[feat])
    assert len(cov["distribution"]) >= 4


@pytest.mark.slow  # a Hypothesis find-and-shrink through the CLI
def test_cli_mutation_found_writes_case_and_snippet_and_replays(tmp_path):
    _deps()
    r = _cli(["--mutation", "causal_top_left", "--examples", "60", "--json", str(tmp_path / "f.json"),
              "--cases-dir", str(tmp_path / "cases")], tmp_path)
    assert r.exit_code == 1, r.output
    assert "FAIL fwd_budget: shrunk to sm90" in r.output and "@example(AttentionProblem.from_json(" in r.output
    cases = list((tmp_path / "cases").glob("*.json"))
    assert len(cases) == 1
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["format"] == fuzz.CAMPAIGN_FORMAT and data["where"] == "CPU twin"
    assert data["failure"]["case_file"] == str(cases[0]) and data["target"]["mutations"] == ["causal_top_left"]
    r2 = _cli(["--replay", str(cases[0])], tmp_path)
    assert r2.exit_code == 1 and "FAIL" in r2.output, r2.output


def test_cli_clean_run_exits_zero_and_reports_coverage(tmp_path):
    _deps()
    r = _cli(["--examples", "15", "--arch", "sm100", "--dtype", "fp16", "--json", str(tmp_path / "c.json")], tmp_path)
    assert r.exit_code == 0, r.output
    assert "[CPU twin]" in r.output and "max tightness" in r.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["arch"] == "sm100" and data["coverage"]["dtype"] == {"fp16": data["examples_run"]}


@pytest.mark.parametrize("args, msg", [
    (["--mutation", "no_such_fault"], "unknown mutation"),
    (["--property", "no_such_property"], "unknown property"),
    (["--target", "production", "--mutation", "causal_top_left"], "--target twin"),
    (["--replay", "does-not-exist.json"], "cannot read case"),
    (["--target", "production", "--accumulation", "sequential"], "use it with --target twin"),
    (["--arch", "sm100", "--accumulation", "sm90-tensor-core"], "models the SM90 tensor core"),
    (["--accumulation", "nope"], "unknown model"),
])
def test_cli_bad_input_is_a_one_line_usage_error(args, msg, tmp_path):
    from fa4verify.cli import main
    import contextlib, io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["fuzz", "--cache-dir", str(tmp_path / "c")] + args)
    assert rc == 2 and msg in err.getvalue() and "Traceback" not in err.getvalue()


def test_production_target_without_cuda_is_an_environment_error(tmp_path, no_cuda):
    from fa4verify.cli import main
    import contextlib, io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["fuzz", "--target", "production", "--cache-dir", str(tmp_path / "c")])
    assert rc == 2 and "no CUDA device" in err.getvalue()


def test_dev_profile_keeps_its_example_database_in_the_cache_dir(tmp_path):
    _deps()
    db = tmp_path / "cache" / "hypothesis"
    fuzz.run_campaign(target=fuzz.TwinTarget(["tail_tile_dropped"]), arch="sm90", examples=5, seed=None,
                      profile="dev", database_dir=db)
    assert db.is_dir() and any(os.scandir(db))


def test_profiles_are_registered():
    from hypothesis import settings
    fuzz.register_profiles()
    ci = settings.get_profile("fa4-ci")
    assert ci.derandomize and ci.deadline is None and ci.database is None
    assert settings.get_profile("fa4-nightly").max_examples >= 1000


def test_cli_twin_with_the_tensor_core_model_decides_the_huge_bf16_corner(tmp_path):
    """``--accumulation sm90-tensor-core``: the twin runs the SM90 wgmma bit for bit and the judge
    takes each score as that point (Note [SM90 MMA model]); the campaign that the worst-case
    enclosure leaves undecided (bf16, huge, seed 13: a right window of 6 with a sink) is decided."""
    _deps()
    base = ["--examples", "40", "--seed", "13", "--dtype", "bf16", "--distribution", "huge"]
    r0 = _cli(base, tmp_path)
    assert r0.exit_code == 10 and "UNDECIDED bwd_budget" in r0.output, r0.output
    r = _cli(base + ["--accumulation", "sm90-tensor-core", "--json", str(tmp_path / "t.json")], tmp_path)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t.json").read_text())["target"]["accumulation"] == "sm90-tensor-core"
