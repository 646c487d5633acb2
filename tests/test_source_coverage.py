"""Note [Source coverage] (fa4verify.coverage.source): the line tracer, the executable-line
denominator, the report's attribution, and ``fa4verify audit --source-coverage``."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from fa4verify.coverage import source as S

_MOD = textwrap.dedent('''\
    def f(x):
        if x > 0:
            y = 1
        else:
            y = 2
        return y


    def never():
        return 3


    class K:
        def m(self):
            return [i for i in range(2)]
    ''')


def _load(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "mod.py").write_text(_MOD)
    spec = importlib.util.spec_from_file_location("fa4v_srccov_mod", root / "mod.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(root), mod


def test_the_tracer_records_exactly_the_lines_run_in_function_bodies_under_its_root(tmp_path):
    root, mod = _load(tmp_path)
    tr = S.LineTracer(root)
    with tr:
        mod.f(1)
        mod.K().m()
    got = tr.to_json()
    assert set(got) == {"mod.py"}
    # f's taken branch and return, m's body and its comprehension; not the else side, not never()
    assert {2, 3, 6}.issubset(got["mod.py"]) and 5 not in got["mod.py"] and 10 not in got["mod.py"]
    assert 15 in got["mod.py"]
    # nothing outside the root is recorded, and the tracer is gone after the block
    tr2 = S.LineTracer(str(tmp_path / "elsewhere"))
    with tr2:
        mod.f(-1)
    assert tr2.to_json() == {}
    assert sys.gettrace() is None


def test_executable_lines_are_the_function_bodies_without_their_def_lines(tmp_path):
    root, _ = _load(tmp_path)
    funcs = {f.qualname: f for f in S.executable_lines(root, ["mod.py"])}
    assert set(funcs) >= {"f", "never", "K.m"}
    assert funcs["f"].lines == frozenset({2, 3, 5, 6})
    assert funcs["never"].lines == frozenset({10})
    assert 14 not in funcs["K.m"].lines        # the def line runs at import, not in a call


def test_the_report_names_unrun_lines_and_what_only_a_drawn_campaign_ran(tmp_path):
    root, _ = _load(tmp_path)
    traces = [{"check": "coverage.production", "lines": {"mod.py": [2, 3, 6]}},
              {"check": "fuzz.production", "lines": {"mod.py": [2, 5, 6]}}]
    rep = S.report(traces, root, files=["mod.py"])
    d = rep["files"]["mod.py"]
    funcs = {fn["function"]: fn for fn in d["functions"]}
    assert funcs["f"]["unrun"] == [] and funcs["f"]["chance"] == [[5, 5]]
    assert funcs["never"]["unrun"] == [[10, 10]] and not funcs["never"]["entered"]
    assert d["run"] == 4 and d["by_construction"] == 3
    assert rep["checks"] == {"coverage.production": 3, "fuzz.production": 3}
    text = S.render(rep)
    assert "mod.py:1 f: only by a drawn campaign 5" in text
    assert "mod.py:9 never: never entered (1 lines)" in text
    # without the campaign, line 5 is not run at all
    rep2 = S.report(traces[:1], root, files=["mod.py"])
    f2 = {fn["function"]: fn for fn in rep2["files"]["mod.py"]["functions"]}["f"]
    assert f2["unrun"] == [[5, 5]] and f2["chance"] == []


def test_tracing_writes_one_file_per_task_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(S.TRACE_ENV, raising=False)
    assert S.traced("x", lambda: 7) == 7
    root, mod = _load(tmp_path)
    monkeypatch.setattr(S, "fa4_root", lambda: root)
    monkeypatch.setenv(S.TRACE_ENV, str(tmp_path / "traces"))
    assert S.traced("coverage.production", mod.f, 1) == 1
    (t,) = S.load_traces(str(tmp_path / "traces"))
    assert t["check"] == "coverage.production" and 3 in t["lines"]["mod.py"]


@pytest.mark.skipif(S.fa4_root() is None, reason="flash-attn-4 is not installed")
def test_the_installed_fa4_is_found_by_path_and_a_host_call_is_traced():
    root = S.fa4_root()
    assert os.path.isfile(os.path.join(root, "cute", "interface.py"))
    from flash_attn.cute import interface
    tr = S.LineTracer(root)
    with tr:
        interface.num_splits_heuristic(1000, 132, 4, 128)
    assert tr.to_json().get(os.path.join("cute", "interface.py"))


def _audit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--device", "cpu",
                           "--no-live", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.skipif(S.fa4_root() is None, reason="flash-attn-4 is not installed (--source-coverage refuses)")
def test_cli_source_coverage_writes_its_report_and_refuses_bad_directories(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != S.TRACE_ENV}
    d = tmp_path / "sc"
    p = _audit("-k", "exp2.deg3", "--source-coverage", str(d), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "FA4 source coverage:" in p.stdout
    rep = json.loads((d / "source_coverage.json").read_text())
    assert rep["tasks"] >= 1 and (d / "source_coverage.txt").read_text().startswith("FA4 source lines run")
    for args, msg in ((["--source-coverage", str(d)], "not empty"),
                      (["--source-coverage", str(tmp_path / "f")], "not a directory"),
                      (["--source-coverage", str(tmp_path / "n"), "--kernel-cache", str(tmp_path / "k")],
                       "leave out --kernel-cache")):
        (tmp_path / "f").write_text("x")
        p = _audit("-k", "exp2.deg3", *args, env=env)
        assert p.returncode == 2 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    # a preset FA4 kernel cache would serve kernels untraced: refused
    p = _audit("-k", "exp2.deg3", "--source-coverage", str(tmp_path / "m"),
               env=dict(env, FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(tmp_path / "k")))
    assert p.returncode == 2 and "unset FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" in p.stderr
    # a refused run leaves nothing that refuses the corrected one; the variable alone traces nothing
    d2 = tmp_path / "again"
    assert _audit("-k", "exp2.deg3 and (", "--source-coverage", str(d2), env=env).returncode == 2
    assert _audit("-k", "exp2.deg3", "--source-coverage", str(d2), env=env).returncode == 0
    d3 = tmp_path / "envonly"
    p = _audit("-k", "exp2.deg3", env=dict(env, **{S.TRACE_ENV: str(d3 / "traces")}))
    assert p.returncode == 0 and not d3.exists() and "FA4 source coverage" not in p.stdout


def test_a_second_tracer_records_what_the_first_did_and_the_old_tracer_comes_back(tmp_path):
    """Tasks of one worker trace one after another: on Python >= 3.12 a location the first tracer
    disabled must fire again for the second; with settrace, the tracer in place before is restored."""
    root, mod = _load(tmp_path)
    got = []
    for _ in range(2):
        tr = S.LineTracer(root)
        with tr:
            mod.f(1)
        got.append(tr.to_json())
    assert got[0] == got[1] and {2, 3, 6} <= set(got[0]["mod.py"])
    if getattr(sys, "monitoring", None) is None:
        def other(frame, event, arg):
            return None
        sys.settrace(other)
        try:
            with S.LineTracer(root):
                mod.f(1)
            assert sys.gettrace() is other
        finally:
            sys.settrace(None)


def test_code_objects_equal_across_files_go_to_their_own_file(tmp_path):
    """Two files holding the same function compile to code objects that compare equal (their file
    name is not in the equality): each call is recorded under its own file."""
    root = tmp_path / "pkg"
    root.mkdir()
    mods = []
    for name in ("a.py", "b.py"):
        (root / name).write_text("def g():\n    return 1\n")
        spec = importlib.util.spec_from_file_location(f"fa4v_srccov_{name[0]}", root / name)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        mods.append(m)
    tr = S.LineTracer(str(root))
    with tr:
        mods[0].g()
        mods[1].g()
    assert tr.to_json() == {"a.py": [2], "b.py": [2]}
