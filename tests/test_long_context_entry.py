"""The GPU entry points of the long-context audit run on the CPU (small sizes, torch32 stand-in)
so the first H200 run does not die of a typo; the check is only in profile 'long'."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_runs_on_cpu_and_writes_json(tmp_path):
    out = tmp_path / "lc.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_long_context.py"), "--device", "cpu", "--kernel",
                        "torch32", "--seqlens", "96,64", "--heads", "2", "--heads-kv", "1", "--head-dim", "16",
                        "--block", "32", "--engine", "device", "--chunk", "40", "--cross-check", "64", "--plant", "64",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    run = d["runs"][0]
    assert run["status"] == "pass" and set(run["verdicts"]) == {"out", "lse", "dq", "dk", "dv"}
    assert {"oracle_forward", "budget_forward", "compare_forward", "oracle_backward", "budget_backward",
            "compare_backward", "total"} <= set(run["seconds"]) and run["n_compared"] > 0
    assert run["fingerprint"]["engine"] == "device"
    assert sum(run["histograms"]["dv"].values()) == run["verdicts"]["dv"]["n_compared"]
    planted = d["runs"][1]                             # seqlen 64: a fault in out and one in dq
    assert planted["status"] == "fail" and planted["planted_caught"] == {"out": True, "dq": True}
    assert planted["verdicts"]["dk"]["status"] == "pass"
    assert planted["cross_check"]["all_same"] is True  # the host engine judged the same outputs alike
    assert "cross-check (host engine" in r.stdout and "phases:" in r.stdout


def test_benchmark_bad_seqlens_is_one_line_exit_2():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_long_context.py"), "--seqlens", "x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_long_check_is_registered_only_in_profile_long():
    from fa4verify.audit import registry
    registry.discover()
    spec = registry.registered()["production.long_context"]
    assert spec.profiles == frozenset({"long"})
    assert "cuda" in spec.needs
    assert all("long" not in s.profiles or s.id == "production.long_context" or s.func.__name__ == "_broken"
               for s in registry.registered().values())


def test_gpu_script_is_valid_bash():
    r = subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu/long_context.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_script_flags_are_the_benchmarks():
    """Every flag the GPU script passes to the benchmark exists (argparse would exit 2 on the H200)."""
    import re
    text = (ROOT / "scripts/gpu/long_context.sh").read_text()
    flags = set(re.findall(r"(--[a-z][a-z-]+)", text.split("python3 benchmarks/gpu_long_context.py", 1)[1].split("> \"$OUT", 1)[0]))
    helptext = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_long_context.py"), "--help"],
                              capture_output=True, text=True, timeout=120).stdout
    assert flags and all(f in helptext for f in flags), flags


@pytest.mark.parametrize("raw, ok", [("1", 1), ("7", 7), ("63", 63), ("8", None), ("64", None), ("1000000000", None),
                                     ("0", None), ("-3", None), ("x", None), ("65", None)])
def test_row_stride_is_bounded(monkeypatch, raw, ok):
    """A row stride of 10^9 judged row 0 only and passed with both planted faults missed (issue 30):
    the stride is 1 or odd up to 63 (an even one keeps hitting the same in-tile row), and a bad one
    stops the audit before any work (exit 2)."""
    from fa4verify.checks import long_context as L
    monkeypatch.setenv(L.ENV_STRIDE, raw)
    if ok is None:
        with pytest.raises(ValueError, match="FA4VERIFY_LONG_ROW_STRIDE"):
            L.row_stride()
    else:
        assert L.row_stride() == ok


def test_a_bad_row_stride_is_a_usage_error_before_any_work(tmp_path):
    env = dict(__import__("os").environ, FA4VERIFY_LONG_ROW_STRIDE="1000000000")
    r = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--no-live", "--profile", "quick",
                        "-k", "budgets.files", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr[-500:]
    assert "FA4VERIFY_LONG_ROW_STRIDE" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
