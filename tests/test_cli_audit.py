"""``fa4verify audit``: every exit code, reports, baseline regressions, isolation, bad input.

All runs use fixture check modules (tests/fixtures/audit_checks_*.py) and fixture budgets,
never the real budgets; ``--no-default-checks`` keeps other engineers' checks out.
"""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest

from fa4verify.cli import main

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
OK = os.path.join(FIX, "audit_checks_ok.py")
BAD = os.path.join(FIX, "audit_checks_bad.py")
BROKEN = os.path.join(FIX, "audit_checks_broken.py")
UNDECIDED = os.path.join(FIX, "audit_checks_undecided.py")
TIGHT = os.path.join(FIX, "budget_tight.toml")


def audit(*args: str) -> int:
    return main(["audit", "--no-default-checks", "--no-live", *args])


def mods(*paths: str) -> list[str]:
    out = []
    for p in paths:
        out += ["--checks-module", p]
    return out


def load(p) -> dict:
    with open(p) as f:
        return json.load(f)


def by_id(rep: dict) -> dict:
    return {r["id"]: r for r in rep["results"]}


# --------------------------------------------------------------------------- exit codes
def test_exit_0_when_every_check_is_within_budget(tmp_path, capsys):
    j = tmp_path / "a.json"
    assert audit(*mods(OK), "--json", str(j)) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "fixture.dot.bf16" in out
    # where each check ran is printed, and the skip reason
    assert "CPU twin" in out and "no CUDA device (torch.cuda.is_available() is False)" in out
    rep = load(j)
    assert rep["summary"]["exit_code"] == 0
    assert by_id(rep)["fixture.needs_cuda"]["status"] == "skip"


def test_exit_1_on_a_budget_violation_from_a_fixture_budget(tmp_path, capsys):
    j = tmp_path / "a.json"
    assert audit(*mods(OK), "--opt", f"budget={TIGHT}", "--json", str(j)) == 1
    r = by_id(load(j))["fixture.dot.bf16"]
    assert r["status"] == "fail" and r["tightness"] > 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("args, msg", [
    (["--dtype", "fp32"], "--dtype 'fp32'"),
    (["--arch", "sm80"], "--arch 'sm80'"),
    (["--profile", "huge"], "--profile 'huge'"),
    (["--shard", "3/2"], "--shard '3/2'"),
    (["--shard", "x"], "--shard 'x'"),
    (["-k", "(a or"], "-k"),
    (["--no-such-option"], "no-such-option"),
])
def test_exit_2_on_bad_options_with_one_line(args, msg, capsys):
    assert audit(*mods(OK), *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


def test_exit_2_on_device_cuda_without_a_gpu(capsys):
    from fa4verify.audit.registry import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is present")
    assert audit(*mods(OK), "--device", "cuda") == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == ["fa4verify audit: error: --device cuda: no CUDA device "
                                "(torch.cuda.is_available() is False)"]


@pytest.mark.parametrize("content", [None, "{not json", '{"schema": "other/1", "results": []}',
                                     b"\xff\xfe\x00garbage"])
def test_exit_2_on_unreadable_or_corrupt_baseline_and_nothing_written(tmp_path, content, capsys):
    base = tmp_path / "base.json"
    if isinstance(content, bytes):
        base.write_bytes(content)
    elif content is not None:
        base.write_text(content)
    j, h = tmp_path / "out.json", tmp_path / "out.html"
    assert audit(*mods(OK), "--baseline", str(base), "--json", str(j), "--html", str(h)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--baseline" in err
    assert not j.exists() and not h.exists()


@pytest.mark.parametrize("kind", ["missing_dir", "is_dir", "readonly_dir"])
def test_exit_2_on_unwritable_output_path_and_no_partial_report(tmp_path, kind, capsys):
    if kind == "missing_dir":
        target = tmp_path / "nope" / "r.json"
    elif kind == "is_dir":
        target = tmp_path
    else:
        if os.geteuid() == 0:
            pytest.skip("root can write into read-only directories")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "r.json"
    other = tmp_path / "ok.html"
    assert audit(*mods(OK), "--json", str(target), "--html", str(other)) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not other.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_exit_3_when_a_check_raises_or_a_module_cannot_import(tmp_path):
    j = tmp_path / "a.json"
    assert audit(*mods(OK, BROKEN), "--json", str(j)) == 3
    r = by_id(load(j))["import.audit_checks_broken"]
    assert r["status"] == "error" and "cannot be imported" in r["summary"]
    assert audit(*mods(BAD), "-k", "raises or zafter", "--json", str(j)) == 3
    rep = by_id(load(j))
    assert rep["fixture.bad.raises"]["status"] == "error"
    assert "RuntimeError: fixture failure inside a check" in rep["fixture.bad.raises"]["summary"]
    assert rep["fixture.bad.zafter"]["status"] == "pass"


def test_exit_5_when_nothing_ran(tmp_path, capsys):
    j = tmp_path / "a.json"
    # only a check that skips (no CUDA device on this machine, or --device cpu on a GPU machine)
    assert audit(*mods(OK), "--device", "cpu", "-k", "needs_cuda", "--json", str(j)) == 5
    assert load(j)["summary"]["counts"]["skip"] == 1
    # nothing selected at all
    assert audit(*mods(OK), "-k", "no_check_has_this_name") == 5
    assert "NOTHING RAN" in capsys.readouterr().out


def test_exit_10_when_a_check_is_undecided():
    assert audit(*mods(UNDECIDED, OK), "-k", "undecided or lines") == 10


# --------------------------------------------------------------------------- isolation
def test_a_check_that_aborts_its_worker_is_reported_and_the_audit_continues(tmp_path):
    j = tmp_path / "a.json"
    code = audit(*mods(BAD), "--isolate", "always", "--json", str(j))
    rep = by_id(load(j))
    abort = rep["fixture.bad.abort"]
    assert abort["status"] == "error" and abort["isolated"]
    assert "SIGABRT" in abort["summary"] and "fixture: about to abort" in abort["summary"]
    assert rep["fixture.bad.zafter"]["status"] == "pass"  # ran after the crash
    assert rep["fixture.bad.skips"]["status"] == "skip"
    assert code == 3


def test_isolated_and_in_process_runs_agree(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert audit(*mods(OK), "-k", "dot", "--json", str(a)) == 0
    assert audit(*mods(OK), "-k", "dot", "--isolate", "always", "--json", str(b)) == 0
    ra, rb = by_id(load(a))["fixture.dot.bf16"], by_id(load(b))["fixture.dot.bf16"]
    assert rb["isolated"] and not ra["isolated"]
    assert ra["metrics"] == rb["metrics"]


# --------------------------------------------------------------------------- baseline
def test_baseline_regression_inside_budget_fails_and_prints_the_diff(tmp_path, capsys):
    base = tmp_path / "base.json"
    assert audit(*mods(OK), "--json", str(base)) == 0
    assert audit(*mods(OK), "--baseline", str(base)) == 0  # same seed: identical metrics
    capsys.readouterr()
    j = tmp_path / "new.json"
    # the metric grows by 10% while the check still passes its budget
    assert audit(*mods(OK), "--opt", "scale=1.1", "--baseline", str(base), "--json", str(j)) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "spread_ulp" in out
    rep = load(j)
    assert by_id(rep)["fixture.dot.bf16"]["status"] == "pass"
    regs = rep["baseline"]["regressions"]
    assert [(g["id"], g["metric"]) for g in regs] == [("fixture.dot.bf16", "spread_ulp")]
    # a smaller metric is an improvement, not a regression; a tolerance admits small growth
    assert audit(*mods(OK), "--opt", "scale=0.9", "--baseline", str(base)) == 0
    assert audit(*mods(OK), "--opt", "scale=1.1", "--baseline", str(base),
                 "--regression-rtol", "0.2") == 0


# --------------------------------------------------------------------------- selection
def test_list_shows_checks_without_running_them(tmp_path, capsys):
    j = tmp_path / "a.json"
    assert audit(*mods(OK, BAD), "--list", "--json", str(j)) == 0
    out = capsys.readouterr().out
    assert "fixture.bad.abort" in out and "fixture.per_arch[sm90]" in out
    assert "about to abort" not in out
    assert not j.exists()


def test_profile_and_arch_select_instances(tmp_path):
    j = tmp_path / "a.json"
    audit(*mods(OK), "--profile", "full", "--arch", "sm100", "--json", str(j))
    ids = set(by_id(load(j)))
    assert "fixture.full_only" in ids and "fixture.per_arch[sm100]" in ids
    assert "fixture.per_arch[sm90]" not in ids
    audit(*mods(OK), "--profile", "exhaustive", "--json", str(j))
    ids = set(by_id(load(j)))
    assert "fixture.dot.bf16" not in ids and "fixture.full_only" in ids


def test_shards_partition_the_checks_and_merge_back(tmp_path, capsys):
    full, s1, s2, s3, m = (tmp_path / f"{n}.json" for n in ("full", "s1", "s2", "s3", "m"))
    args = [*mods(OK, UNDECIDED), "--profile", "full"]
    audit(*args, "--json", str(full))
    for i, p in enumerate((s1, s2, s3), 1):
        audit(*args, "--shard", f"{i}/3", "--json", str(p))
    parts = [set(by_id(load(p))) for p in (s1, s2, s3)]
    assert parts[0].isdisjoint(parts[1]) and parts[1].isdisjoint(parts[2])
    assert parts[0] | parts[1] | parts[2] == set(by_id(load(full)))
    code = main(["report", "merge", str(s1), str(s2), str(s3), "-o", str(m)])
    merged = load(m)
    assert set(by_id(merged)) == set(by_id(load(full)))
    assert code == merged["summary"]["exit_code"] == load(full)["summary"]["exit_code"] == 10
    assert main(["report", "show", str(m)]) == 10
    assert "fixture.undecided" in capsys.readouterr().out


def test_merge_refuses_reports_of_different_audits(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    audit(*mods(OK), "--json", str(a))
    audit(*mods(OK), "--dtype", "fp16", "--json", str(b))
    assert main(["report", "merge", str(a), str(b), "-o", str(tmp_path / "m.json")]) == 2
    assert "dtype" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


# --------------------------------------------------------------------------- reports
def test_json_report_has_schema_seeds_versions_and_results(tmp_path):
    j = tmp_path / "a.json"
    audit(*mods(OK), "--seed", "7", "--json", str(j))
    rep = load(j)
    assert rep["schema"] == "fa4verify.audit/1"
    assert rep["seeds"]["audit"] == 7 and rep["config"]["seed"] == 7
    v = rep["environment"]["versions"]
    for key in ("fa4verify", "FA4", "CuTe DSL", "torch", "numpy", "python"):
        assert key in v
    assert rep["environment"]["hardware"]["device"] == "cpu"
    r = by_id(rep)["fixture.dot.bf16"]
    for key in ("status", "where", "summary", "metrics", "details", "tightness", "duration_s"):
        assert key in r
    # a different seed gives different measurements (the seed reaches the checks)
    j2 = tmp_path / "b.json"
    audit(*mods(OK), "--seed", "8", "--json", str(j2))
    assert by_id(load(j2))["fixture.dot.bf16"]["metrics"] != r["metrics"]


def test_junit_has_one_testcase_per_check_with_skip_and_failure(tmp_path):
    x = tmp_path / "a.xml"
    audit(*mods(OK), "--opt", f"budget={TIGHT}", "--junit", str(x))
    suite = ET.parse(x).getroot().find("testsuite")
    cases = {tc.get("name"): tc for tc in suite.iter("testcase")}
    assert set(cases) == {"fixture.dot.bf16", "fixture.lines", "fixture.needs_cuda",
                          "fixture.per_arch[sm90]", "fixture.per_arch[sm100]"}
    assert cases["fixture.dot.bf16"].find("failure") is not None
    assert "no CUDA device" in cases["fixture.needs_cuda"].find("skipped").get("message")
    assert cases["fixture.lines"].find("failure") is None
    assert suite.get("tests") == "5" and suite.get("failures") == "1" and suite.get("skipped") == "1"


def test_html_report_embeds_one_png_per_plot(tmp_path):
    h = tmp_path / "a.html"
    audit(*mods(OK), "--html", str(h))
    text = h.read_text()
    # 2 plots of fixture.dot.bf16, 1 of fixture.lines, 1 overview
    assert text.count('src="data:image/png;base64,') == 4
    assert "http://" not in text and "https://" not in text  # self-contained
    assert "fixture.per_arch[sm100]" in text and "no CUDA device" in text


def test_failed_report_rendering_leaves_no_partial_file(tmp_path, monkeypatch):
    import fa4verify.audit.report_html as rh

    j, h = tmp_path / "a.json", tmp_path / "a.html"
    j.write_text("previous")

    def boom(report):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(rh, "render", boom)
    assert audit(*mods(OK), "--json", str(j), "--html", str(h)) == 2
    assert not h.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_merge_with_a_baseline_fails_on_a_regression(tmp_path, capsys):
    base, s1, s2, m = (tmp_path / f"{n}.json" for n in ("base", "s1", "s2", "m"))
    assert audit(*mods(OK), "--json", str(base)) == 0
    audit(*mods(OK), "--opt", "scale=1.5", "--shard", "1/2", "--json", str(s1))
    audit(*mods(OK), "--opt", "scale=1.5", "--shard", "2/2", "--json", str(s2))
    code = main(["report", "merge", str(s1), str(s2), "-o", str(m), "--baseline", str(base)])
    assert code == 1 and load(m)["summary"]["exit_code"] == 1
    assert [g["metric"] for g in load(m)["baseline"]["regressions"]] == ["spread_ulp"]
    assert "REGRESSION" in capsys.readouterr().out


def test_a_hung_isolated_check_is_killed_at_the_timeout(tmp_path):
    import time

    hang = os.path.join(FIX, "audit_checks_hang.py")
    j = tmp_path / "a.json"
    t0 = time.monotonic()
    code = audit(*mods(hang, OK), "-k", "hang or lines", "--isolate", "always", "--timeout", "2",
                 "--json", str(j))
    assert time.monotonic() - t0 < 60
    rep = by_id(load(j))
    assert rep["fixture.hang"]["status"] == "error"
    assert "did not finish in 2 s" in rep["fixture.hang"]["summary"]
    assert rep["fixture.lines"]["status"] == "pass"
    assert code == 3
