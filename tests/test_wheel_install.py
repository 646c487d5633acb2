"""A wheel install works (issue 18, item 4): built with ``pip wheel --no-deps``, installed
non-editable into a fresh venv, run from a directory outside the checkout.

The fresh venv sees this environment's dependencies (numpy, click, torch, the CuTe DSL, ...)
through a filtered view of this environment's site-packages -- every entry except fa4verify's own
(the editable finder ``__editable__*fa4verify*``, its dist-info, any ``.pth`` pointing into the
checkout) -- added with ``site.addsitedir`` from a ``.pth`` file, so the wheel's copy is the only
fa4verify it can import. The test asserts that, then runs the CLI:

* ``fa4verify --help`` and ``fa4verify budgets show --dtype bf16 --arch sm100`` (the budget files
  come from the wheel);
* ``fa4verify audit --dtype bf16 --profile quick --json r.json``: exit 0 or 1, where 1 may only
  come from ``production.head_dims*`` (the recorded FA4 dQ finding); the checks that read the
  recorded GPU evidence (package data ``fa4verify.kernels.evidence``) must run, not skip:
  ``golden.twin_ex2``, ``golden.binary32`` pass, ``production.head_dims`` gives its verdict;
* the evidence checks outside the quick profile (``exp2.mufu``, ``production.figures``) pass
  from the wheel too;
* every evidence file of the checkout is installed (same names, same bytes).

Runs in the normal CPU suite, unmarked (~33 s alone on the 2-core box, most of it the quick
audit). Skips only when the build tools (setuptools' backend, pip, venv) are not installed here.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE_SRC = ROOT / "kernels" / "evidence"

pytestmark = [
    pytest.mark.slow,  # builds a wheel and a venv, runs the CLI in it
    pytest.mark.skipif(os.name != "posix", reason="the wheel test builds a POSIX venv (symlinked site view)"),
    pytest.mark.skipif(importlib.util.find_spec("setuptools") is None,
                       reason="setuptools (the build backend) is not installed; cannot build the wheel"),
    pytest.mark.skipif(importlib.util.find_spec("pip") is None, reason="pip is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("venv") is None, reason="the venv module is not available"),
]

#: copied source tree leaves these out (build outputs, caches, environments)
_COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".hypothesis", "reports", ".devbundle", ".whl",
                                      ".fa4verify-cache", "*.pyc")
#: evidence files the package must ship (everything in kernels/evidence but the accessor)
_NOT_EVIDENCE = {"__init__.py"}


def _is_own(entry: Path) -> bool:
    """fa4verify's own entries in a site-packages dir (editable finder, .pth, metadata, package)."""
    n = entry.name.lower()
    if n == "fa4verify" or n.startswith(("fa4verify-", "fa4verify.")):
        return True
    if n.startswith("__editable__") and "fa4verify" in n:
        return True
    if n.endswith((".pth", ".egg-link")):
        try:
            text = entry.read_text(errors="replace")
        except OSError:
            return False
        return str(ROOT) in text or "fa4verify" in text
    return False


def _site_dirs() -> list[Path]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages() in sys.path:
        dirs.append(site.getusersitepackages())
    out = []
    for d in dirs:
        p = Path(d)
        if p.is_dir() and p not in out:
            out.append(p)
    return out


def _filtered_view(src: Path, dst: Path) -> list[str]:
    """Symlink every entry of ``src`` into ``dst`` except fa4verify's own; returns those left out."""
    dst.mkdir(parents=True)
    left_out = []
    for entry in sorted(src.iterdir()):
        if _is_own(entry):
            left_out.append(entry.name)
            continue
        (dst / entry.name).symlink_to(entry)
    return left_out


def _run(cmd, cwd, env, timeout=300):
    t0 = time.time()
    r = subprocess.run([str(c) for c in cmd], cwd=str(cwd), env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r, time.time() - t0


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_wheel_install_runs_the_cli_and_the_recorded_evidence_checks(tmp_path):
    timings = {}
    # --- build the wheel from a copy of the checkout (build/ and egg-info stay out of the checkout)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_COPY_IGNORE, symlinks=True)
    wheels = tmp_path / "wheels"
    env0 = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r, timings["build"] = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                "--no-index", "-q", "-w", wheels, src], tmp_path, env0)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    whl = sorted(wheels.glob("fa4verify-*.whl"))
    assert len(whl) == 1, f"expected one fa4verify wheel, got {whl}"

    # --- fresh venv, wheel installed non-editable, dependencies through a filtered site view
    venv = tmp_path / "venv"
    r, timings["venv"] = _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env0)
    assert r.returncode == 0, r.stderr
    vpy = venv / "bin" / "python"
    r, _ = _run([vpy, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env0)
    assert r.returncode == 0, r.stderr
    purelib = Path(r.stdout.strip())
    assert purelib.is_dir() and purelib.resolve().is_relative_to(venv.resolve()), purelib
    views, left_out = [], []
    for i, d in enumerate(_site_dirs()):
        view = tmp_path / f"parent_site_{i}"
        left_out += _filtered_view(d, view)
        views.append(str(view))
    (purelib / "_fa4verify_test_parent_env.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({v!r})" for v in views) + "\n")
    r, timings["install"] = _run([sys.executable, "-m", "pip", "--python", vpy, "install", "--no-deps",
                                  "--no-index", "--no-compile", "-q", whl[0]], tmp_path, env0)
    assert r.returncode == 0, f"pip install of the wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    # environment of every run: outside the checkout, nothing steering fa4verify to the checkout
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in env0.items() if not k.startswith("FA4VERIFY_")}
    env.update(COLUMNS="400", NO_COLOR="1", PYTHONNOUSERSITE="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env0.get('PATH', '')}")
    env.pop("VIRTUAL_ENV", None)

    # --- the installed package is the wheel's, and it carries every evidence file
    probe = ("import json, fa4verify, fa4verify.kernels.evidence as e, fa4verify.kernels.golden as g; "
             "print(json.dumps({'fa4verify': fa4verify.__file__, 'evidence': str(e.evidence_dir()), "
             "'golden': str(g.golden_dir()), 'files': sorted(str(p.relative_to(e.evidence_dir())) "
             "for p in e.evidence_dir().rglob('*') if p.is_file() and '__pycache__' not in p.parts)}))")
    r, _ = _run([vpy, "-c", probe], run_dir, env)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("fa4verify", "evidence", "golden"):
        p = Path(info[key]).resolve()
        assert p.is_relative_to(purelib.resolve()), f"{key} imported from {p}, not the venv's {purelib} " \
                                                      f"(left out of the site view: {left_out})"
        assert not p.is_relative_to(ROOT), f"{key} imported from the checkout: {p}"
    want = sorted(str(p.relative_to(EVIDENCE_SRC)) for p in EVIDENCE_SRC.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.name not in _NOT_EVIDENCE)
    assert {"golden/probe_outputs.npz", "golden/mufu_stats.json", "golden/hd_sweep_h200.json",
            "determinism/h200_manifest.json"} <= set(want), want
    got = [f for f in info["files"] if f not in _NOT_EVIDENCE]
    assert got == want, f"evidence in the wheel differs from kernels/evidence: missing " \
                        f"{sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}"
    installed = Path(info["evidence"])
    for f in want:
        assert _sha(installed / f) == _sha(EVIDENCE_SRC / f), f"{f} differs from the checkout's copy"

    fa4v = venv / "bin" / "fa4verify"
    assert fa4v.is_file(), "the wheel installed no fa4verify console script"

    # --- fa4verify --help
    r, timings["help"] = _run([fa4v, "--help"], run_dir, env)
    assert r.returncode == 0, f"fa4verify --help: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "internal error" not in r.stdout + r.stderr
    for sub in ("audit", "budgets", "exp2"):
        assert sub in r.stdout, f"subcommand {sub} missing from --help:\n{r.stdout}"

    # --- fa4verify budgets show (budget files from the wheel)
    r, timings["budgets"] = _run([fa4v, "budgets", "show", "--dtype", "bf16", "--arch", "sm100"], run_dir, env)
    assert r.returncode == 0, f"budgets show: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "bf16_sm100.toml" in r.stdout and "s_accum" in r.stdout, r.stdout[-3000:]
    assert str(ROOT) not in r.stdout, "budgets show read the checkout's budget files"

    # --- fa4verify audit --profile quick
    rep_path = tmp_path / "r.json"
    r, timings["audit_quick"] = _run([fa4v, "audit", "--dtype", "bf16", "--profile", "quick",
                                      "--json", rep_path], run_dir, env, timeout=480)
    out = r.stdout[-4000:] + "\n" + r.stderr[-4000:]
    assert r.returncode in (0, 1), f"audit: exit {r.returncode} (0 or 1 expected)\n{out}"
    assert "internal error" not in out, out
    rep = json.loads(rep_path.read_text())
    res = {x["id"]: x for x in rep["results"]}
    failed = sorted(i for i, x in res.items() if x["status"] not in ("pass", "skip"))
    assert all(i.startswith("production.head_dims") for i in failed), \
        f"checks other than production.head_dims* did not pass: " \
        f"{[(i, res[i]['status'], res[i]['summary']) for i in failed]}"
    assert (r.returncode == 1) == bool(failed), (r.returncode, failed)
    for cid in ("golden.twin_ex2", "golden.binary32"):
        assert cid in res, f"{cid} not run by the quick profile: {sorted(res)}"
        assert res[cid]["status"] == "pass", f"{cid}: {res[cid]['status']}: {res[cid]['summary']}"
        assert res[cid]["where"] == "recorded on NVIDIA H200 (sm_90)", res[cid]
    hd = res.get("production.head_dims")
    assert hd is not None and hd["status"] in ("pass", "fail"), \
        f"production.head_dims did not read the recorded sweep: {hd and (hd['status'], hd['summary'])}"
    assert hd["where"] == "recorded on NVIDIA H200 (sm_90)", hd
    skipped = {i: x["summary"] for i, x in res.items() if x["status"] == "skip"}
    for i, why in skipped.items():
        assert "not found" not in why and "not recorded" not in why, f"{i} skipped for missing evidence: {why}"

    # --- the evidence checks of the default profile (MUFU statistics, production figures)
    rep2_path = tmp_path / "r2.json"
    r, timings["audit_evidence"] = _run([fa4v, "audit", "--dtype", "bf16", "--profile", "default",
                                         "-k", "exp2.mufu or production.figures", "--json", rep2_path],
                                        run_dir, env, timeout=300)
    assert r.returncode == 0, f"audit -k mufu/figures: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    res2 = {x["id"]: x for x in json.loads(rep2_path.read_text())["results"]}
    for cid in ("exp2.mufu", "production.figures"):
        assert cid in res2, f"{cid} not selected: {sorted(res2)}"
        assert res2[cid]["status"] == "pass", f"{cid}: {res2[cid]['status']}: {res2[cid]['summary']}"
        assert res2[cid]["where"] == "recorded on NVIDIA H200 (sm_90)", res2[cid]
    assert str(ROOT) not in res2["exp2.mufu"]["summary"], res2["exp2.mufu"]["summary"]
    print("wheel test timings (s):", {k: round(v, 1) for k, v in timings.items()})
