"""``fa4verify exp2`` as a user runs it: reports, labels, JSON, and clean usage errors."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fa4verify.cli import cli, main


def _run(args, **kw):
    return CliRunner().invoke(cli, ["exp2", *args], catch_exceptions=False, **kw)


def test_small_range_report_is_labelled_and_versioned(tmp_path):
    out = tmp_path / "r.json"
    r = _run(["--range", "-0.5:-0.45", "--degree", "3", "--jobs", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "CPU twin" in r.output and "max_rel_error" in r.output and "cutlass-dsl" in r.output
    rep = json.loads(out.read_text())
    assert rep["where"] == "CPU twin" and rep["range"] == [-0.5, -0.45]
    v = rep["versions"]
    assert {"fa4", "dsl", "numpy", "fa4verify", "params_source"} <= set(v)
    d = rep["degrees"]["3"]
    assert d["n_inputs"] > 1_000_000 and d["where"] == "CPU twin"
    assert 0 < d["max_rel_error"] < 8.8e-5 and d["monotonicity_violations"] == 0
    assert d["certified_poly_bound"]["lower"] <= d["certified_poly_bound"]["upper"]
    assert {"per_input", "uniform_in_value"} <= set(rep["rate_conventions"])
    assert set(d["edge_domain"]) >= {"nan", "-inf", "+inf", "le_minus127", "subnormal_region", "tiny_negatives", "ge_128"}
    assert rep["mufu"]["status"] in ("recorded", "not measured here")


def test_sample_mode_and_degree_all(tmp_path):
    out = tmp_path / "s.json"
    r = _run(["--sample", "20000", "--degree", "all", "--json", str(out), "--seed", "3"])
    # degrees 1 and 2 exceed the emulation budget emu_rel (8.8e-5): a violation, exit 1
    assert r.exit_code == 1, r.output
    rep = json.loads(out.read_text())
    assert sorted(rep["degrees"]) == ["1", "2", "3", "4", "5"] and rep["mode"] == "sample"
    errs = [rep["degrees"][d]["max_rel_error"] for d in ("1", "2", "3", "4", "5")]
    assert errs == sorted(errs, reverse=True)          # higher degree, smaller error
    v = rep["verdict"]["degrees"]
    assert [v[d]["status"] for d in ("1", "2", "3", "4", "5")] == ["fail", "fail", "pass", "pass", "pass"]
    assert rep["exit_code"] == 1 and "degree 1: VIOLATION" in r.output


@pytest.mark.parametrize("args,fragment", [
    (["--range", "1:a"], "--range"), (["--range", "3:1"], "--range"), (["--range", "nope"], "--range"),
    (["--degree", "7"], "--degree"), (["--degree", "x"], "--degree"),
    (["--json", "/nonexistent-dir/x.json"], "--json"), (["--sample", "0"], "--sample"),
    (["--sample", "10", "--direct"], "mutually exclusive"),
])
def test_bad_input_is_a_one_line_usage_error_with_exit_2(args, fragment, capsys):
    rc = main(["exp2", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert fragment in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fa4verify exp2: error: ")


def test_pinned_params_are_reported_when_fa4_is_absent(tmp_path, monkeypatch):
    from fa4verify.kernels.fa4_params import load_params
    monkeypatch.setenv("FA4VERIFY_FORCE_PINNED", "1")
    load_params.cache_clear()
    try:
        out = tmp_path / "p.json"
        r = _run(["--sample", "2000", "--json", str(out)])
        assert r.exit_code == 0, r.output
        rep = json.loads(out.read_text())
        assert rep["params_source"].startswith("pinned copy") and "warning" in rep
        assert "pinned copy" in r.output
    finally:
        monkeypatch.delenv("FA4VERIFY_FORCE_PINNED")
        load_params.cache_clear()


@pytest.mark.parametrize("args", [["--range", "130:140"], ["--range=-127:-126.5", "--sample", "100"]])
def test_range_outside_the_main_domain_reports_nothing_ran(args, capsys):
    rc = main(["exp2", *args])
    out, err = capsys.readouterr()
    assert rc == 5 and "nothing measured" in err and "Traceback" not in err
    assert "no input of the range lies in the main domain" in out
