"""benchmarks/gpu_audit_time.py (the H200 audit-time table, cold and warm): the table code on
synthetic reports, the whole script end to end on the CPU (``--dry-run``, a fixture check of
several tasks), and the shell driver parses and names recorded reports that exist."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "fixtures" / "audit_checks_cases.py"


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_audit_time", ROOT / "benchmarks" / "gpu_audit_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rep(rows, exit_code=1, workers=8):
    return {"config": {"workers": workers}, "summary": {"exit_code": exit_code, "counts": {"pass": 1}},
            "results": [dict(id=i, duration_s=s, status=st, timing=t) for i, s, st, t in rows]}


def test_table_shows_one_row_per_check_and_its_slowest_task():
    b = _bench()
    before = _rep([("fuzz.production", 118.2, "pass", []), ("exp2.deg3", 0.4, "pass", [])], workers=4)
    tasks = [{"start_s": 1.0, "end_s": 15.25}] + [{"start_s": 2.0, "end_s": 3.0}] * 7
    after = _rep([("fuzz.production", 19.5, "pass", tasks), ("exp2.deg3", 0.4, "pass", [])])
    lines, summary = b.format_table([("s4-cold", before), ("cold", after)], [None, 41.0],
                                    profile="default", gpu="NVIDIA H200")
    text = "\n".join(lines)
    fz = next(ln for ln in lines if ln.startswith("fuzz.production"))
    assert "118.2 pas" in fz and "19.5 pas" in fz and "14.2/8" in fz
    assert "max/k" in lines[1] and "41.0" in text and "verdicts of every mode agree" in text
    assert summary["modes"]["cold"]["largest_item"] == ["fuzz.production (1 of 8 tasks)", 14.25]
    assert summary["modes"]["s4-cold"]["largest_item"] == ["fuzz.production", 118.2]
    assert summary["modes"]["cold"]["per_check"]["fuzz.production"]["tasks"] == 8
    other = _rep([("fuzz.production", 20.0, "undecided", []), ("exp2.deg3", 0.4, "pass", [])])
    lines, summary = b.format_table([("a", after), ("b", other)], [1.0, 2.0], profile="default", gpu=None)
    assert lines[-1] == "VERDICTS DIFFER between modes: fuzz.production" and summary["verdicts_agree"] is False


def test_the_script_runs_every_mode_on_the_cpu(tmp_path, capsys):
    b = _bench()
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps(_rep([("fixture.cases.grid", 9.0, "pass", [])], exit_code=0)))
    out = tmp_path / "out"
    rc = b.main(["--profile", "default", "--modes", "cold,warm", "--dry-run",
                 "--out", str(out), "--timeout", "240", "--recorded", f"s4={rec}", "--",
                 "--no-default-checks", "--checks-module", str(CASES), "-k", "fixture.cases.grid",
                 "--isolate", "always", "--workers", "2"])
    text = capsys.readouterr().out
    assert rc == 0, text
    s = json.loads((out / "audit_time_default.json").read_text())
    assert list(s["modes"]) == ["s4", "cold", "warm"]
    for m in ("cold", "warm"):
        assert s["modes"][m]["per_check"]["fixture.cases.grid"]["tasks"] == 6     # one task per key
        assert s["modes"][m]["exit_code"] == 0
    assert s["verdicts_agree"] is True and "verdicts of every mode agree" in text
    assert re.search(r"fixture\.cases\.grid\s+9\.0 pas", text)
    assert (out / "audit_default_cold.log").exists()


def test_kernels_cold_has_its_own_empty_kernel_cache_and_shares_the_bytecode_cache(tmp_path):
    b = _bench()
    caches = {"shard": str(tmp_path / "shard"), "kernels-cold": str(tmp_path / "shard-kernels-cold")}
    modes = ["cold", "warm", "kernels-cold"]
    assert b._cache_for("cold", modes, caches) == b._cache_for("warm", modes, caches) == caches["shard"]
    kc = b._cache_for("kernels-cold", modes, caches)
    assert kc != caches["shard"]
    # FA4VERIFY_CACHE_DIR (the bytecode cache) is derived from the kernel cache's parent: shared
    assert os.path.dirname(kc) == os.path.dirname(caches["shard"])
    assert b._cache_for("before", modes, caches) is None


def test_bad_modes_and_missing_recorded_reports_exit_2(tmp_path):
    b = _bench()
    assert b.main(["--modes", "sideways", "--dry-run", "--out", str(tmp_path)]) == 2
    assert b.main(["--recorded", str(tmp_path / "nope.json"), "--dry-run", "--out", str(tmp_path)]) == 2


def test_the_shell_driver_parses_and_its_recorded_reports_exist(tmp_path):
    sh = ROOT / "scripts" / "gpu" / "audit_time.sh"
    assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0
    text = sh.read_text()
    recorded = re.findall(r"=\$base/(\S+?\.json)", text)
    assert recorded
    for path in recorded:
        assert (ROOT / "docs" / "results" / "h200" / "audit_time" / path).is_file(), path
    assert "set -u" in text and "timeout" in text
    rc = subprocess.run(["bash", str(sh), "sideways"], capture_output=True, text=True,
                        env={**os.environ, "OUT": str(tmp_path / "out")})
    assert rc.returncode == 2 and "usage" in rc.stderr


def test_against_alternates_the_two_trees_and_reinstalls_this_one(monkeypatch, tmp_path):
    """``--against``: warm audits of this tree and the other in turn, each after its own install,
    on one cache; this tree installed again at the end, also when an audit raises."""
    b = _bench()
    seq = []
    monkeypatch.setattr(b, "install", lambda tree: seq.append(("install", tree)))

    def fake_run(mode, profile, out, cache, extra, timeout, device="cuda", label=None, cwd=None):
        seq.append((label, cwd, cache, mode))
        if label == "warm-other-2" and profile == "boom":
            raise RuntimeError("boom")
        return {"mode": label, "rc": 0, "wall_s": 1.0, "report": {}}
    monkeypatch.setattr(b, "run_mode", fake_run)
    other = str(tmp_path)
    runs = b.against(other, 2, "default", str(tmp_path), "/c/shard", [], 10.0, "cuda")
    here = str(ROOT)
    assert [r["mode"] for r in runs] == ["warm-this-1", "warm-other-1", "warm-this-2", "warm-other-2"]
    assert seq == [("install", here), ("warm-this-1", here, "/c/shard", "warm"),
                   ("install", other), ("warm-other-1", other, "/c/shard", "warm"),
                   ("install", here), ("warm-this-2", here, "/c/shard", "warm"),
                   ("install", other), ("warm-other-2", other, "/c/shard", "warm"), ("install", here)]
    seq.clear()
    import pytest
    with pytest.raises(RuntimeError):
        b.against(other, 2, "boom", str(tmp_path), "/c/shard", [], 10.0, "cuda")
    assert seq[-1] == ("install", here)


def test_against_needs_a_project_tree(tmp_path, capsys):
    assert _bench().main(["--dry-run", "--against", str(tmp_path)]) == 2
    assert "no project tree" in capsys.readouterr().err


def test_an_audit_in_another_tree_names_that_trees_commit_and_writes_here(monkeypatch, tmp_path):
    """``run_mode(cwd=...)``: the other tree's stamp (or none, never this tree's commit), and the
    report and cache paths absolute (the child runs in the other tree)."""
    b = _bench()
    seen = {}

    def fake(args, stdout=None, stderr=None, env=None, timeout=None, cwd=None):
        seen.update(args=args, env=env, cwd=cwd)
        return subprocess.CompletedProcess(args, 0)
    monkeypatch.setattr(b.subprocess, "run", fake)
    monkeypatch.setenv("FA4VERIFY_GIT_COMMIT", "thiscommit")
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "outrel").mkdir()
    b.run_mode("warm", "default", "outrel", "kc/shard", [], 10.0, label="warm-other-1", cwd=str(other))
    assert "FA4VERIFY_GIT_COMMIT" not in seen["env"] and seen["cwd"] == str(other)
    js = seen["args"][seen["args"].index("--json") + 1]
    kc = seen["args"][seen["args"].index("--kernel-cache") + 1]
    assert js == str(tmp_path / "outrel" / "audit_default_warm-other-1.json") and kc == str(tmp_path / "kc" / "shard")
    (other / ".fa4verify-commit").write_text("othercommit\n")
    b.run_mode("warm", "default", "outrel", "kc/shard", [], 10.0, label="warm-other-1", cwd=str(other))
    assert seen["env"]["FA4VERIFY_GIT_COMMIT"] == "othercommit"
    b.run_mode("warm", "default", "outrel", "kc/shard", [], 10.0)
    assert seen["env"]["FA4VERIFY_GIT_COMMIT"] == "thiscommit" and seen["cwd"] is None


def test_against_needs_a_mode_that_fills_the_cache(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("")
    assert _bench().main(["--dry-run", "--modes", "before", "--against", str(tmp_path)]) == 2
    assert "needs a cold or warm mode" in capsys.readouterr().err
