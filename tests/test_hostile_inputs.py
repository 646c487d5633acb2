"""Issue 14: every hostile input gets a clear error (one line on stderr, exit 2) or a verdict --
never a silent pass, a traceback or a destroyed file.

One test per item of the issue (and per extra defect found while fixing it); the parametrized
rows are the hostile inputs. Each asserts the exit code AND that stderr is one line, and for file
cases that the earlier files are intact (a device node untouched). CLI runs are in-process
(``fa4verify.cli.main``) except where exit codes, signals or pytest itself need a subprocess.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fa4verify.cli import main
from fa4verify import errors

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
OK = str(FIX / "audit_checks_ok.py")
HANG = str(FIX / "audit_checks_hang.py")
BUDGETS = ROOT / "error_budgets"
PREV = '{"previous": true}\n'


# ----------------------------------------------------------------------------------- helpers
def record(inp: str, rc, message: str) -> None:
    """With ``$FA4VERIFY_HOSTILE_TABLE`` set, append one row of the issue's table (input -> exit
    code -> message) to that JSON-lines file; otherwise nothing."""
    path = os.environ.get("FA4VERIFY_HOSTILE_TABLE")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("::")[-1]
        msg = next((ln for ln in message.splitlines() if ln.strip()), "")
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "input": inp, "rc": rc, "message": msg[:300]}) + "\n")


def run(capsys, *argv: str):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    record("fa4verify " + " ".join(a if a else "''" for a in argv), rc, err)
    return rc, out, err


def one_line(err: str, prog: str | None = None) -> str:
    """stderr is exactly one (non-blank) line, in the shared ``<prog>: error: ...`` format."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"stderr is not one line:\n{err}"
    assert "Traceback" not in err
    if prog is not None:
        assert lines[0].startswith(f"{prog}: error: "), lines[0]
    return lines[0]


def audit_args(*args: str) -> list[str]:
    return ["audit", "--no-default-checks", "--no-live", "--checks-module", OK, *args]


def cli(*args, env=None, timeout=300, cwd=None):
    e = dict(os.environ, **(env or {}))
    e.pop("FA4VERIFY_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "fa4verify", *args], capture_output=True, text=True,
                       env=e, timeout=timeout, cwd=cwd)
    envs = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    record(f"{envs} fa4verify {' '.join(args)}".strip(), r.returncode,
           r.stderr if r.returncode else (r.stdout.strip().splitlines() or [""])[-1])
    return r


def mknod_or_skip(path: Path) -> os.stat_result:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a /dev/null twin
    except (PermissionError, OSError) as e:
        pytest.skip(f"mknod is not permitted here: {e}")
    return os.stat(path)


def budget_file(tmp_path: Path, name: str, body: str, extends: str = str(BUDGETS / "bf16_sm90.toml")) -> Path:
    p = tmp_path / name
    p.write_text(f'[meta]\nschema_version = 1\nextends = "{extends}"\ndtype = "bf16"\narch = "sm90"\n{body}\n')
    return p


def write_prev(p: Path) -> Path:
    p.write_text(PREV)
    return p


def no_temp_files(d: Path) -> None:
    left = [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
    assert not left, f"temporary files left behind: {left}"


# ------------------------------------------------- 1. non-regular outputs are never replaced
@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "dangling-symlink"])
def test_01_report_writer_refuses_non_regular_outputs(kind, tmp_path, capsys):
    d = tmp_path / "d"
    target = tmp_path / "target.json"
    before = None
    if kind == "device":
        before = mknod_or_skip(d)
        argv = ["audit", "--no-live", "--profile", "quick", "-k", "budgets.files", "--json", str(d)]
    else:
        if kind == "fifo":
            os.mkfifo(d)
        elif kind == "symlink":
            write_prev(target)
            d.symlink_to(target)
        else:
            d.symlink_to(tmp_path / "nowhere.json")
        argv = audit_args("--json", str(d))
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    line = one_line(err, "fa4verify audit")
    assert "--json" in line and "refusing to replace it" in line
    st = os.lstat(d)
    if kind == "device":
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == before.st_rdev and st.st_ino == before.st_ino
    elif kind == "fifo":
        assert stat.S_ISFIFO(st.st_mode)
    else:
        assert stat.S_ISLNK(st.st_mode)
    if kind == "symlink":
        assert target.read_text() == PREV
    assert not (tmp_path / "nowhere.json").exists()


# ---------------------------------------- 2. an output that is an input or another output
@pytest.mark.parametrize("case", ["show-html-is-input", "audit-json-html-dot-slash", "audit-hardlink",
                                  "merge-output-is-input", "merge-html-is-baseline",
                                  "audit-json-is-checks-module"])
def test_02_same_file_is_compared_by_real_path_and_inode(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c1 = tmp_path / "c1.json"
    assert main(audit_args("--json", str(c1))) == 0
    s1, s2 = tmp_path / "s1.json", tmp_path / "s2.json"
    if case.startswith("merge"):
        assert main(audit_args("--shard", "1/2", "--json", str(s1))) in (0, 5)
        assert main(audit_args("--shard", "2/2", "--json", str(s2))) in (0, 5)
    capsys.readouterr()
    mod = tmp_path / "mychecks.py"
    shutil.copy(OK, mod)
    keep = {p: p.read_bytes() for p in (c1, s1, s2, mod) if p.exists()}
    if case == "show-html-is-input":
        argv, prog = ["report", "show", "c1.json", "--html", "c1.json"], "fa4verify report show"
    elif case == "audit-json-html-dot-slash":
        argv, prog = audit_args("--json", "a", "--html", "./a"), "fa4verify audit"
    elif case == "audit-hardlink":
        os.link(c1, tmp_path / "hard.json")
        argv, prog = audit_args("--json", "c1.json", "--html", "hard.json"), "fa4verify audit"
    elif case == "merge-output-is-input":
        argv, prog = ["report", "merge", "s1.json", "s2.json", "-o", "./s1.json"], "fa4verify report merge"
    elif case == "merge-html-is-baseline":
        argv, prog = (["report", "merge", "s1.json", "s2.json", "-o", "m.json", "--baseline", "c1.json",
                       "--html", str(tmp_path / "." / "c1.json")], "fa4verify report merge")
    else:
        argv, prog = (["audit", "--no-default-checks", "--no-live", "--checks-module", str(mod),
                       "--json", "./mychecks.py"], "fa4verify audit")
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    line = one_line(err, prog)
    assert "same file" in line
    for p, data in keep.items():
        assert p.read_bytes() == data, f"{p.name} was modified"
    assert not (tmp_path / "a").exists() and not (tmp_path / "m.json").exists()


def test_02_plugin_compares_its_outputs_by_real_path(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fa4verify=quick",
                        "--fa4-only", "--fa4-json", "a", "--fa4-html", "./a", "-k", "budgets.files"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    record("pytest --fa4verify=quick --fa4-json a --fa4-html ./a", r.returncode, r.stderr)
    assert r.returncode == 4, r.stdout + r.stderr              # pytest's usage-error exit
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "same file" in err[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


# ----------------------------------------------------------- 3. multi-file writes all-or-none
def test_03_invalid_second_output_leaves_the_first_untouched(tmp_path, capsys):
    prev = write_prev(tmp_path / "prev.json")
    rc, out, err = run(capsys, *audit_args("--json", str(prev), "--html", str(tmp_path / "no" / "x.html")))
    assert rc == 2
    assert "--html" in one_line(err, "fa4verify audit")
    assert prev.read_text() == PREV
    no_temp_files(tmp_path)


def test_03_a_failed_rename_puts_back_every_replaced_file(tmp_path, monkeypatch):
    from fa4verify.audit import atomic

    a, b = write_prev(tmp_path / "a.json"), write_prev(tmp_path / "b.json")
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device (simulated)")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    with pytest.raises(OSError, match="simulated") as ei:
        atomic.write_all([(str(a), b"new a"), (str(b), b"new b"), (str(tmp_path / "c.json"), b"new c")])
    record("write_all(a, b, c) with the 2nd rename failing (ENOSPC)", "OSError", f"{ei.value}; a, b restored, c absent")
    monkeypatch.setattr(atomic.os, "replace", real)
    assert a.read_text() == PREV and b.read_text() == PREV and not (tmp_path / "c.json").exists()
    no_temp_files(tmp_path)


# ------------------------------------------------------------------ 4. --regression-rtol nan
@pytest.mark.parametrize("cmd", ["audit", "merge"])
@pytest.mark.parametrize("rtol", ["nan", "-0.1", "inf"])
def test_04_regression_rtol_must_be_finite_and_non_negative(cmd, rtol, tmp_path, capsys):
    base, s1, s2 = tmp_path / "base.json", tmp_path / "s1.json", tmp_path / "s2.json"
    assert main(audit_args("--json", str(base))) == 0
    worse = ["--opt", "scale=1.5"]
    if cmd == "audit":
        assert main(audit_args(*worse, "--baseline", str(base), "--regression-rtol", "0")) == 1
        argv = audit_args(*worse, "--baseline", str(base), "--regression-rtol", rtol,
                          "--json", str(tmp_path / "out.json"))
        prog = "fa4verify audit"
    else:
        main(audit_args(*worse, "--shard", "1/2", "--json", str(s1)))
        main(audit_args(*worse, "--shard", "2/2", "--json", str(s2)))
        argv = ["report", "merge", str(s1), str(s2), "-o", str(tmp_path / "out.json"),
                "--baseline", str(base), f"--regression-rtol={rtol}"]
        prog = "fa4verify report merge"
    capsys.readouterr()
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert "--regression-rtol" in one_line(err, prog)
    assert not (tmp_path / "out.json").exists()


# ------------------------------------------------------------------------------- 5. budgets
BAD_BUDGETS = {
    "u_p-inf": ("[constants]\nu_p = inf", "constants.u_p", "not finite"),
    "u_p-nan": ("[constants]\nu_p = nan", "constants.u_p", "not finite"),
    "u_p-negative": ("[constants]\nu_p = -1", "constants.u_p", "negative"),
    "constant-1-div-0": ('[constants]\nu_p = "1 / 0"', "constants.u_p", "not finite"),
    "constant-over-zero-constant": ('[constants]\nzz = 0\nww = "1 / zz"', "constants.ww", "not finite"),
    "formula-1e400": ('[stage.p_cast]\nformula = "1e400 * p"\nreason = "DERIVATIONS.md#p-cast"',
                      "stage.p_cast.formula", "not a finite float64"),
    "formula-overflow": ('[stage.p_cast]\nformula = "1e300 * 1e300 * p"\nreason = "DERIVATIONS.md#p-cast"',
                         "stage.p_cast.formula", "not finite"),
    "formula-negative": ('[stage.p_cast]\nformula = "-1 * p"\nreason = "DERIVATIONS.md#p-cast"',
                         "stage.p_cast.formula", "negative"),
    "confidence-bool": ('[stage.p_cast]\nformula = "u_p * p"\nconfidence = true\nreason = "DERIVATIONS.md#p-cast"',
                        "stage.p_cast.confidence", "(0, 1]"),
}


@pytest.mark.parametrize("name", sorted(BAD_BUDGETS))
def test_05_budgets_reject_non_finite_negative_and_unevaluable_values(name, tmp_path, capsys):
    body, key, why = BAD_BUDGETS[name]
    f = budget_file(tmp_path, f"{name}.toml", body)
    for argv in (["budgets", "validate", "--file", str(f)], ["budgets", "show", "--json", "--file", str(f)]):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and out == ""
        line = one_line(err, f"fa4verify budgets {argv[1]}")
        assert str(f) in line and key in line and why in line, line
    # and the gate cannot use it: a zero output is not silently passed
    import numpy as np

    from fa4verify.error_budgets import BudgetError
    from fa4verify.gates import assert_attention_within_budget
    q = np.ones((1, 4, 1, 8), np.float32)
    with pytest.raises(BudgetError, match=key.replace(".", r"\.")) as ei:
        assert_attention_within_budget(np.zeros_like(q), q, q, q, dtype="bf16", arch="sm90", budget=str(f))
    record(f"gates.assert_attention_within_budget(zeros, budget={name}.toml)", "BudgetError", str(ei.value))


@pytest.mark.parametrize("target", ["directory", "binary", "/dev/zero", "fifo", "self", "chain-of-20"])
def test_05_extends_reads_only_small_regular_files_without_cycles(target, tmp_path, capsys):
    if target == "directory":
        ext = str(tmp_path)
    elif target == "binary":
        (tmp_path / "blob").write_bytes(bytes(range(256)) * 64)
        ext = str(tmp_path / "blob")
    elif target == "fifo":
        os.mkfifo(tmp_path / "pipe")
        ext = str(tmp_path / "pipe")
    elif target == "self":
        ext = "bad.toml"
    elif target == "chain-of-20":
        prev = str(BUDGETS / "bf16_sm90.toml")
        for i in range(20):
            prev = str(budget_file(tmp_path, f"c{i}.toml", "", extends=prev))
        ext = prev
    else:
        ext = target
    f = budget_file(tmp_path, "bad.toml", "", extends=ext)
    t0 = time.monotonic()
    rc, out, err = run(capsys, "budgets", "validate", "--file", str(f))
    assert time.monotonic() - t0 < 30
    assert rc == 2
    line = one_line(err, "fa4verify budgets validate")
    assert "meta.extends" in line, line


def test_05_budgets_show_json_is_strict_json(capsys):
    rc, out, err = run(capsys, "budgets", "show", "--json", "--dtype", "bf16", "--arch", "sm90")
    assert rc == 0 and err == ""

    def no_bare(c):
        raise AssertionError(f"bare {c} in budgets show --json")

    data = json.loads(out, parse_constant=no_bare)
    assert data and all(isinstance(v, float) for s in data for v in s["constants"].values())


# ---------------------------------------------------------------- 6. incomplete shard sets
@pytest.mark.parametrize("case", ["same-file-twice", "same-file-via-./", "one-of-two", "same-shard-copied",
                                  "unsharded-with-shard", "mixed-partitions"])
def test_06_merge_never_passes_an_incomplete_shard_set(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i in (1, 2):
        main(audit_args("--shard", f"{i}/2", "--json", f"s{i}.json"))
    main(audit_args("--json", "full.json"))
    main(audit_args("--shard", "1/3", "--json", "t1.json"))
    shutil.copy("s1.json", "copy.json")
    capsys.readouterr()
    assert main(["report", "merge", "s1.json", "s2.json", "-o", "good.json"]) == 0   # the complete set
    capsys.readouterr()
    reports = {"same-file-twice": ["s1.json", "s1.json"], "same-file-via-./": ["s1.json", "./s1.json"],
               "one-of-two": ["s1.json"], "same-shard-copied": ["s1.json", "copy.json", "s2.json"],
               "unsharded-with-shard": ["full.json", "s1.json"],
               "mixed-partitions": ["s1.json", "s2.json", "t1.json"]}[case]
    rc, out, err = run(capsys, "report", "merge", *reports, "-o", "m.json")
    assert rc == 2
    line = one_line(err, "fa4verify report merge")
    assert any(w in line for w in ("same file", "shard", "incomplete")), line
    assert not (tmp_path / "m.json").exists()


# -------------------------------------------- 7. output paths checked before the work starts
@pytest.mark.parametrize("case", ["fuzz-cases-dir-proc", "fuzz-json-dir", "mutants-json-fifo",
                                  "mutants-markdown-dev", "determinism-manifest-dir",
                                  "determinism-json-symlink", "sass-json-fifo", "sass-keep-dir-file"])
def test_07_outputs_are_validated_before_any_work(case, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(write_prev(tmp_path / "real.json"))
    afile = write_prev(tmp_path / "afile")
    argv = {
        "fuzz-cases-dir-proc": ["fuzz", "--mutation", "causal_off_by_one", "--examples", "20", "--cases-dir", "/proc/x"],
        "fuzz-json-dir": ["fuzz", "--examples", "5", "--json", str(tmp_path)],
        "mutants-json-fifo": ["mutants", "--json", str(fifo)],
        "mutants-markdown-dev": ["mutants", "--markdown", "/dev/null"],
        "determinism-manifest-dir": ["determinism", "--backend", "twin", "--manifest", str(tmp_path)],
        "determinism-json-symlink": ["determinism", "--backend", "twin", "--json", str(link)],
        "sass-json-fifo": ["sass", "--arch", "sm_90a", "--head-dim", "64", "--json", str(fifo)],
        "sass-keep-dir-file": ["sass", "--arch", "sm_90a", "--head-dim", "64", "--keep-dir", str(afile)],
    }[case]
    t0 = time.monotonic()
    rc, out, err = run(capsys, *argv)
    assert time.monotonic() - t0 < 20, "the work ran before the output path was checked"
    assert rc == 2
    line = one_line(err, f"fa4verify {argv[0]}")
    assert any(o in line for o in ("--cases-dir", "--json", "--markdown", "--manifest", "--keep-dir")), line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and stat.S_ISLNK(os.lstat(link).st_mode)
    assert (tmp_path / "real.json").read_text() == PREV and afile.read_text() == PREV


@pytest.mark.slow  # a Hypothesis find-and-shrink through the CLI
def test_07_fuzz_mutation_with_a_writable_cases_dir_exits_1_and_writes_the_case(tmp_path):
    """The repro's counterpart: the mutant is found (exit 1, not 3), the case is written, and no
    numpy RuntimeWarning (item 12) reaches the user."""
    r = cli("fuzz", "--mutation", "causal_off_by_one", "--examples", "20", "--seed", "0",
            "--cache-dir", str(tmp_path / "cache"), env={"FA4VERIFY_CASES_DIR": str(tmp_path / "cases"),
                                                         "PYTHONWARNINGS": "default"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "RuntimeWarning" not in r.stderr and "All-NaN" not in r.stderr and "Traceback" not in r.stderr
    assert list((tmp_path / "cases").glob("*.json"))


# ------------------------------------------------------------------------------------ 8. exp2
@pytest.mark.parametrize("args,fragment", [
    (["--seed", "-1"], "--seed"), (["--sample", "99999999999999999999"], "--sample"),
    (["--sample", "100", "--exhaustive"], "mutually exclusive"), (["--range", "-1e40:0"], "--range"),
    (["--range", "0:1e39"], "--range"), (["--jobs", "100000"], "--jobs"), (["--json", ""], "--json"),
])
def test_08_exp2_bad_input_is_one_line_exit_2(args, fragment, tmp_path, capsys):
    rc, out, err = run(capsys, "exp2", *args)
    assert rc == 2 and out == ""
    assert fragment in one_line(err, "fa4verify exp2")


def test_08_exp2_degree_1_is_a_violation(tmp_path, capsys):
    j = tmp_path / "d1.json"
    rc, out, err = run(capsys, "exp2", "--degree", "1", "--sample", "2000", "--json", str(j))
    assert rc == 1, out + err
    rep = json.loads(j.read_text())
    assert rep["exit_code"] == 1 and rep["verdict"]["degrees"]["1"]["status"] == "fail"
    assert any("emu_rel" in v for v in rep["verdict"]["violations"])
    assert "degree 1: VIOLATION" in out
    rc, out, err = run(capsys, "exp2", "--degree", "3", "--sample", "2000")
    assert rc == 0, out + err


def test_08_exp2_json_is_not_pre_created_on_a_crash(tmp_path, capsys, monkeypatch):
    import fa4verify.cli.exp2 as E

    def boom(*a, **k):
        raise RuntimeError("simulated crash in the sweep")

    monkeypatch.setattr(E, "run_exp2", boom)
    prev = write_prev(tmp_path / "prev.json")
    rc, out, err = run(capsys, "exp2", "--sample", "10", "--json", str(tmp_path / "new.json"))
    assert rc == 3 and "internal error" in one_line(err)
    assert not (tmp_path / "new.json").exists()
    rc, out, err = run(capsys, "exp2", "--sample", "10", "--json", str(prev))
    assert rc == 3 and prev.read_text() == PREV
    no_temp_files(tmp_path)


def _sigint_default() -> None:
    """In a signal test's child: SIGINT's default action, whatever the test runner inherited (a
    background job ignores SIGINT, and so would the command under test)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow  # an exp2 sweep in a subprocess, interrupted
def test_08_exp2_sigint_exits_130_and_leaves_no_file(tmp_path):
    prev = write_prev(tmp_path / "prev.json")
    for out in (prev, tmp_path / "new.json"):
        # the exhaustive sweep on one job (2.2e9 inputs) outlasts the wait on any machine; the
        # sampled sweep could finish before the signal on an idle one
        ready = tmp_path / f"ready-{out.name}"
        p = subprocess.Popen([sys.executable, "-m", "fa4verify", "exp2", "--degree", "3", "--exhaustive",
                              "--jobs", "1", "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, FA4VERIFY_READY_FILE=str(ready)),
                             preexec_fn=_sigint_default)
        deadline = time.monotonic() + 120      # the command's readiness marker, not a sleep
        while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "exp2 never started its sweep"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        record(f"SIGINT to fa4verify exp2 --degree 3 --jobs 1 --json {out.name}", p.returncode, err)
        assert p.returncode == 130, err
        assert one_line(err) == "fa4verify: interrupted"
    assert prev.read_text() == PREV and not (tmp_path / "new.json").exists()
    no_temp_files(tmp_path)


# ------------------------------------------------------ 9. timeouts, empty paths, SIGINT, sass
@pytest.mark.parametrize("argv,fragment", [
    (audit_args("--timeout", "-5"), "--timeout"), (audit_args("--timeout", "nan"), "--timeout"),
    (audit_args("--timeout", "inf"), "--timeout"), (audit_args("--json", ""), "--json"),
    (audit_args("--html", ""), "--html"), (["report", "show", "x.json", "--junit", ""], "--junit"),
    (["determinism", "--backend", "twin", "--time-budget", "-1"], "--time-budget"),
    (["determinism", "--backend", "twin", "--time-budget", "nan"], "--time-budget"),
    (["determinism", "--backend", "twin", "--json", ""], "--json"),
    (["mutants", "--json", ""], "--json"), (["fuzz", "--json", ""], "--json"),
    (["fuzz", "--time-limit", "nan"], "--time-limit"),
    (["sass", "--arch", "sm_90a", "--head-dim", "64", "--head-dim-v", "3"], "--head-dim-v 3"),
    (["sass", "--arch", "sm_100a", "--head-dim", "192", "--head-dim-v", "192"], "--head-dim-v 192"),
])
def test_09_bad_values_are_one_line_exit_2(argv, fragment, capsys):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert fragment in one_line(err, "fa4verify " + argv[0] + (" show" if argv[0] == "report" else ""))


def test_09_audit_sigint_exits_130_with_earlier_files_intact(tmp_path):
    j = write_prev(tmp_path / "a.json")
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-m", "fa4verify", "audit", "--no-default-checks", "--no-live",
                          "--checks-module", HANG, "--checks-module", OK, "-k", "hang", "--isolate", "never",
                          "--opt", f"ready={ready}", "--json", str(j)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    deadline = time.monotonic() + 240           # issue 30 item 8: the check's readiness marker, not a sleep
    while not ready.exists():
        assert p.poll() is None and time.monotonic() < deadline, "the audit never reached its check"
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    record("SIGINT to fa4verify audit -k hang --isolate never --json a.json", p.returncode, err)
    assert p.returncode == 130, err
    assert one_line(err) == "fa4verify: interrupted"
    assert j.read_text() == PREV
    no_temp_files(tmp_path)


def test_09_sass_json_dash_prints_json_alone(capsys, monkeypatch):
    import fa4verify.compile.census as C

    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("flash_attn", "cutlass") else real(name, *a))
    monkeypatch.setattr(C, "compile_case", lambda case, keep: {"case": case})
    monkeypatch.setattr(C, "census_case", lambda res: {
        "label": "stub", "compile_seconds": 0.0, "forward_config": {"arch": 90},
        "kernels": {"k": {"ptx": {"fma.rn.f32x2": 3}, "sass": {"FFMA": 7}}}, "ratio": float("nan")})
    rc, out, err = run(capsys, "sass", "--arch", "sm_90a", "--head-dim", "64", "--json", "-")
    record("fa4verify sass --arch sm_90a --head-dim 64 --json - (stubbed compile)", rc,
           f"stdout is JSON ({len(out)} bytes), table on stderr")
    assert rc == 0
    data = json.loads(out)                                # stdout is the JSON alone
    assert data["kernels"]["k"]["sass"]["FFMA"] == 7 and data["ratio"] == "nan"
    assert "FA4 instruction census" in err                # the table went to stderr


# ------------------------------------------------------------ 10. pytest --strict-markers
@pytest.mark.slow  # a fresh pytest that discovers every audit check
def test_10_plugin_registers_its_markers(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers",
                        "--fa4verify=quick", "--fa4-only", "-k", "budgets.files"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    record("pytest --strict-markers --fa4verify=quick --fa4-only -k budgets.files", r.returncode,
           (r.stdout.strip().splitlines() or [""])[-1])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "INTERNALERROR" not in r.stdout + r.stderr and "1 passed" in r.stdout


# --------------------------------------------------- 11. README environment variables in audit
def test_11_fa4verify_seed_is_honoured_and_validated(tmp_path, capsys, monkeypatch):
    j = tmp_path / "a.json"
    monkeypatch.setenv("FA4VERIFY_SEED", "7")
    assert main(audit_args("--json", str(j))) == 0
    rep = json.loads(j.read_text())
    assert rep["config"]["seed"] == 7 and rep["seeds"]["audit"] == 7
    assert main(audit_args("--seed", "3", "--json", str(j))) == 0      # the option wins
    assert json.loads(j.read_text())["config"]["seed"] == 3
    capsys.readouterr()
    for bad in ("-1", "abc"):
        monkeypatch.setenv("FA4VERIFY_SEED", bad)
        rc, out, err = run(capsys, *audit_args("--json", str(j)))
        assert rc == 2 and "seed" in one_line(err, "fa4verify audit").lower()


def test_11_fa4verify_budget_file_is_honoured_and_validated(tmp_path, capsys, monkeypatch):
    from fa4verify.error_budgets import loader

    good = budget_file(tmp_path, "mine.toml", "[constants]\nu_out = \"u_bf16\"")
    monkeypatch.setenv("FA4VERIFY_BUDGET_FILE", str(good))
    assert loader.load("bf16", "sm90").files[-1] == str(good)          # used for its dtype/arch
    assert loader.load("bf16", "sm100").files[-1].endswith("bf16_sm100.toml")
    j = tmp_path / "a.json"
    rc, out, err = run(capsys, "audit", "--no-live", "--profile", "quick", "-k", "budgets.files", "--json", str(j))
    assert rc == 0, out + err
    rep = json.loads(j.read_text())
    assert rep["config"]["budget_file"] == str(good) and str(good) in rep["results"][0]["summary"]
    bad = budget_file(tmp_path, "bad.toml", "[constants]\nu_p = inf")
    monkeypatch.setenv("FA4VERIFY_BUDGET_FILE", str(bad))
    write_prev(j)
    rc, out, err = run(capsys, *audit_args("--json", str(j)))
    assert rc == 2 and out == ""
    line = one_line(err, "fa4verify audit")
    assert "FA4VERIFY_BUDGET_FILE" in line and str(bad) in line and "constants.u_p" in line
    assert j.read_text() == PREV


# ---------------------------------------------------------- 12. one-line click errors everywhere
@pytest.mark.parametrize("argv,prog", [
    (["exp2", "--nope"], "fa4verify exp2"), (["fuzz", "--nope"], "fa4verify fuzz"),
    (["fuzz", "--target", "gpu"], "fa4verify fuzz"), (["mutants", "--nope"], "fa4verify mutants"),
    (["mutants", "--mutant", "nope"], "fa4verify mutants"), (["determinism", "--runs", "x"], "fa4verify determinism"),
    (["sass", "--arch", "sm_90a"], "fa4verify sass"), (["budgets", "show", "--dtype", "fp4"], "fa4verify budgets show"),
    (["budgets", "nope"], "fa4verify budgets"), (["report", "nope"], "fa4verify report"),
    (["report", "show"], "fa4verify report show"), (["nope"], "fa4verify"), (["audit", "--nope"], "fa4verify audit"),
])
def test_12_click_errors_are_one_line_in_every_subcommand(argv, prog, capsys):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    one_line(err, prog)


# ---------------------------------------------------------------------------- 14. exp2.mufu
def test_14_exp2_mufu_is_judged_with_the_flush_band_apart(monkeypatch):
    import fa4verify.checks.exp2 as X
    import fa4verify.exp2.mufu_stats as E
    from fa4verify.audit.registry import CheckContext

    ctx = CheckContext(dtype="bf16", arch="sm90", profile="default", check_id="exp2.mufu")
    r = X.mufu(ctx)
    record("exp2.mufu on kernels/evidence/golden/mufu_stats.json", r.status, r.summary)
    assert r.status == "pass", r.summary
    assert "8.389e+06" not in r.summary and "flush band" in r.summary and "mufu_ex2_rel" in r.summary
    assert not any("ulp" in k and "127" in k for k in r.metrics)
    band = [row for row in r.details["judged"] if row["part"] == "flush band"]
    assert band and all(b["budget_name"] == "f32_min_normal" and b["measured"] < 2.0**-126 for b in band)
    # a MUFU figure over mufu_ex2_rel is a failure, no longer "reported, not judged"
    real = E.mufu_section()
    worse = json.loads(json.dumps(real))
    worse["stats"]["stats"]["ex2.approx.ftz [0,8]"]["max_rel_err"] = 3e-7
    monkeypatch.setattr(E, "mufu_section", lambda: worse)
    r = X.mufu(ctx)
    record("exp2.mufu with MUFU max rel 3e-7 on [0,8] (> mufu_ex2_rel)", r.status, r.summary)
    assert r.status == "fail" and "ex2.approx.ftz [0,8]" in r.summary
    # an entry reaching into the flush band with no separate main-domain figure cannot be judged
    del worse["stats"]["stats"]["ex2.approx.ftz [-126,0]"]
    worse["stats"]["stats"]["ex2.approx.ftz [0,8]"]["max_rel_err"] = 1e-7
    r = X.mufu(ctx)
    record("exp2.mufu with [-127,0] but no [-126,0] entry", r.status, r.summary)
    assert r.status == "undecided"


def test_14_exp2_checks_state_the_range_they_sample(monkeypatch):
    import fa4verify.checks.exp2 as X
    from fa4verify.audit.registry import CheckContext

    ctx = CheckContext(dtype="bf16", arch="sm100", profile="quick", check_id="exp2.deg3", seed=0)
    r = X.deg3(ctx)
    record("exp2.deg3 (quick)", r.status, r.summary)
    assert r.status == "pass", r.summary
    assert "main domain [-126, 8]" in r.summary and "[-127, 8]" not in r.summary
    assert r.details["main_domain"] == [-126.0, 8.0] and r.details["flush_band"]["within_floor"]
    assert r.details["flush_band"]["n_inputs"] == 131071


# ------------------------------------------------ 15. own-module failures fail, never skip
def test_15_a_broken_budget_file_fails_the_fuzz_tests_instead_of_skipping(tmp_path):
    bad = budget_file(tmp_path, "bad.toml", "[constants]\nu_p = nan")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        str(ROOT / "tests" / "test_fuzz_properties.py"), "-k", "violation_message",
                        "--rootdir", str(ROOT)],
                       capture_output=True, text=True, env=dict(os.environ, FA4VERIFY_BUDGET_FILE=str(bad)),
                       timeout=300)
    record("FA4VERIFY_BUDGET_FILE=bad.toml pytest tests/test_fuzz_properties.py -k violation_message",
           r.returncode, (r.stdout.strip().splitlines() or [""])[-1])
    assert r.returncode == 1, r.stdout[-3000:]
    assert "1 failed" in r.stdout and "skipped" not in r.stdout and "constants.u_p" in r.stdout


def test_15_no_test_skips_when_fa4verify_modules_fail_to_import():
    offenders = []
    for p in sorted((ROOT / "tests").glob("test_*.py")):
        src = p.read_text()
        for node in ast.walk(ast.parse(src)):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("fa4verify")):
                offenders.append(f"{p.name}:{node.lineno} importorskip({node.args[0].value!r})")
            if isinstance(node, ast.Try) and any(
                    isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "Exception") and any(
                        isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "skip"
                        for b in h.body for c in ast.walk(b)) for h in node.handlers):
                if "fa4verify" in ast.get_source_segment(src, node).split("except")[0]:
                    offenders.append(f"{p.name}:{node.lineno} try/except -> pytest.skip around fa4verify code")
    record("lint tests/: importorskip or skip-on-failure of fa4verify's own modules", len(offenders),
           f"{len(offenders)} offender(s)")
    assert not offenders, offenders


# --------------------------------------------------------------------- 16. vacuous asserts
def test_16_no_test_asserts_a_constant():
    """``assert np.isfinite(1.0)`` can never fail: an assert in a test whose expression names
    nothing but numpy/math and literals is vacuous."""
    allowed = {"np", "numpy", "math", "True", "False", "None"}
    offenders = []
    for p in sorted((ROOT / "tests").glob("test_*.py")):
        tests = [f for f in ast.walk(ast.parse(p.read_text()))
                 if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]
        for node in (n for f in tests for n in ast.walk(f)):
            if isinstance(node, ast.Assert):
                names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                if names <= allowed:
                    offenders.append(f"{p.name}:{node.lineno}")
    record("lint tests/: assert of a constant (assert np.isfinite(1.0))", len(offenders),
           f"{len(offenders)} offender(s)")
    assert not offenders, offenders


# --------------------------------------------------------------------------------- 17. CI
def test_17_ci_run_fails_on_pip_errors_and_runs_the_main_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and "|| true\n" not in ci.replace("|| true; }", "")
    assert "fa4verify audit --dtype bf16" in ci and ".ci/check_audit_exit.py" in ci
    start = ci.index("quiet_pip() {")
    fn = ci[start:ci.index("\n}\n", start) + 3]
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + fn +
                        "quiet_pip install -q --no-index /nonexistent/fa4verify-no-such-package\necho reached"],
                       capture_output=True, text=True, timeout=120)
    record(".ci/run quiet_pip install <missing package> (set -euo pipefail)", r.returncode,
           next((ln for ln in r.stdout.splitlines() + r.stderr.splitlines() if "ERROR" in ln), ""))
    assert r.returncode != 0 and "reached" not in r.stdout
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + fn + "quiet_pip --version >/dev/null\necho reached"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "reached" in r.stdout


@pytest.mark.parametrize("rc,results,ok", [
    (1, [("production.head_dims", "fail"), ("a", "pass")], True),
    (1, [("production.head_dims", "fail"), ("exp2.deg3", "fail")], False),
    (1, [("a", "pass")], False),
    (3, [("production.head_dims", "fail"), ("b", "error")], False),
    (0, [("a", "pass"), ("b", "skip")], True),
    (5, [("b", "skip")], False),
    (0, [("production.head_dims", "fail")], False),
])
def test_17_ci_accepts_only_the_documented_exit_codes_of_the_main_command(rc, results, ok):
    sys.path.insert(0, str(ROOT / ".ci"))
    try:
        import check_audit_exit as C
    finally:
        sys.path.pop(0)
    rep = {"summary": {"exit_code": rc}, "results": [{"id": i, "status": s} for i, s in results]}
    v = C.verdict(rc, rep)
    record(f".ci/check_audit_exit.py rc={rc} results={results}", 0 if v[0] else 1, v[1])
    assert v[0] is ok


# --------------------------------------------------------------------------- extra defects
@pytest.mark.parametrize("case", ["show-fifo", "show-dev-zero", "baseline-fifo", "merge-directory",
                                  "replay-fifo", "from-json-dev-zero", "against-fifo", "configs-fifo",
                                  "checks-module-fifo"])
def test_extra_inputs_must_be_regular_files_no_hang(case, tmp_path, capsys):
    """A FIFO, /dev/zero or a directory given as an input file used to hang (open/read) or
    exhaust memory; now one line, exit 2, at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    argv = {"show-fifo": ["report", "show", str(fifo)], "show-dev-zero": ["report", "show", "/dev/zero"],
            "baseline-fifo": audit_args("--baseline", str(fifo)),
            "merge-directory": ["report", "merge", str(tmp_path), "-o", str(tmp_path / "m.json")],
            "replay-fifo": ["fuzz", "--replay", str(fifo)],
            "from-json-dev-zero": ["mutants", "--from-json", "/dev/zero"],
            "against-fifo": ["determinism", "--backend", "twin", "--against", str(fifo)],
            "configs-fifo": ["determinism", "--backend", "twin", "--configs", f"@{fifo}"],
            "checks-module-fifo": ["audit", "--no-default-checks", "--no-live", "--checks-module",
                                   str(tmp_path / "fifo.py")]}[case]
    if case == "checks-module-fifo":
        os.mkfifo(tmp_path / "fifo.py")
    t0 = time.monotonic()
    rc, out, err = run(capsys, *argv)
    assert time.monotonic() - t0 < 20
    assert rc == 2
    line = one_line(err)
    assert any(w in line for w in ("FIFO", "character device", "directory")), line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_extra_mutants_from_json_cannot_overwrite_its_input(tmp_path, capsys):
    src = write_prev(tmp_path / "res.json")
    rc, out, err = run(capsys, "mutants", "--from-json", str(src), "--json", str(tmp_path / "." / "res.json"))
    assert rc == 2 and "same file" in one_line(err, "fa4verify mutants")
    assert src.read_text() == PREV


def test_extra_report_show_refuses_a_tampered_exit_code(tmp_path, capsys):
    j = tmp_path / "a.json"
    assert main(audit_args("--json", str(j))) == 0
    rep = json.loads(j.read_text())
    rep["summary"]["exit_code"] = "0; rm -rf"
    j.write_text(json.dumps(rep))
    capsys.readouterr()
    rc, out, err = run(capsys, "report", "show", str(j))
    assert rc == 2 and "exit_code" in one_line(err, "fa4verify report show")


def test_extra_cli_interrupt_constant_is_130():
    from fa4verify.cli import INTERRUPTED

    assert INTERRUPTED == 128 + signal.SIGINT == 130


@pytest.mark.parametrize("argv,code", [
    (audit_args("--opt", f"budget={FIX / 'budget_tight.toml'}"), 1),
    (["exp2", "--degree", "1", "--sample", "500"], 1),
    (["report", "show", str(FIX / "no-such-report.json")], 2),
])
def test_extra_exit_codes_survive_click_standalone_mode(argv, code):
    """Through CliRunner (click's standalone mode) a returned exit code used to be dropped: a
    budget violation exited 0."""
    from click.testing import CliRunner

    from fa4verify.cli import cli as group

    r = CliRunner().invoke(group, argv)
    record("CliRunner: fa4verify " + " ".join(argv), r.exit_code, r.output.strip().splitlines()[-1] if r.output.strip() else "")
    assert r.exit_code == code, r.output


# ====================================================================================== issue 30
# ------------------------------------------------ 18. evidence identity (audit fingerprint)
def _shards(tmp_path, first=(), second=(), mod2=None):
    s1, s2 = tmp_path / "s1.json", tmp_path / "s2.json"
    assert main(audit_args(*first, "--shard", "1/2", "--json", str(s1))) in (0, 5)
    argv = audit_args(*second, "--shard", "2/2", "--json", str(s2))
    if mod2 is not None:
        argv[argv.index(OK)] = str(mod2)
    assert main(argv) in (0, 1, 5)
    return s1, s2


@pytest.mark.parametrize("case", ["other-opt", "other-checks-module", "other-budget-file", "no-fingerprint",
                                  "tampered-digest"])
def test_18_merge_refuses_shards_of_different_audits(case, tmp_path, capsys, monkeypatch):
    """Shard 1/2 of one audit and shard 2/2 of another used to merge into PASSED, exit 0."""
    mod2 = None
    if case == "other-checks-module":
        mod2 = tmp_path / "audit_checks_ok.py"          # same name, other content
        mod2.write_text(Path(OK).read_text() + "\n# another checks module\n")
    if case == "other-budget-file":
        s1 = tmp_path / "s1.json"
        assert main(audit_args("--shard", "1/2", "--json", str(s1))) in (0, 5)
        monkeypatch.setenv("FA4VERIFY_BUDGET_FILE", str(budget_file(tmp_path, "mine.toml", "")))
        s2 = tmp_path / "s2.json"
        assert main(audit_args("--shard", "2/2", "--json", str(s2))) in (0, 5)
    else:
        s1, s2 = _shards(tmp_path, second=("--opt", "scale=1.5") if case == "other-opt" else (), mod2=mod2)
    if case in ("no-fingerprint", "tampered-digest"):
        rep = json.loads(s2.read_text())
        if case == "no-fingerprint":
            del rep["fingerprint"]
        else:
            rep["fingerprint"]["digest"] = "0" * 64
        s2.write_text(json.dumps(rep))
    capsys.readouterr()
    rc, out, err = run(capsys, "report", "merge", str(s1), str(s2), "-o", str(tmp_path / "m.json"))
    assert rc == 2, out + err
    line = one_line(err, "fa4verify report merge")
    assert "audit" in line and "fingerprint" in line or "another audit" in line, line
    assert not (tmp_path / "m.json").exists()


def test_18_every_report_carries_the_audit_fingerprint(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(audit_args("--json", str(a))) == 0
    assert main(audit_args("--opt", "scale=1.5", "--json", str(b))) == 0
    fa, fb = json.loads(a.read_text())["fingerprint"], json.loads(b.read_text())["fingerprint"]
    assert len(fa["digest"]) == 64 and fa["digest"] != fb["digest"]
    assert set(fa["parts"]) >= {"config", "checks_modules", "budget_files", "versions", "gpu"}
    assert fa["parts"]["config"]["opts"] == {} and fb["parts"]["config"]["opts"] == {"scale": "1.5"}
    s1, s2 = _shards(tmp_path)                      # the shards of one audit share it, and merge
    f1, f2 = (json.loads(p.read_text())["fingerprint"] for p in (s1, s2))
    assert f1 == f2 and f1["digest"] == fa["digest"]
    capsys.readouterr()
    assert main(["report", "merge", str(s1), str(s2), "-o", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["fingerprint"]["digest"] == fa["digest"]


def _hollow_baseline(base: Path, how: str) -> None:
    rep = json.loads(base.read_text())
    for r in rep["results"]:
        if how == "all-nan":
            r["metrics"] = {k: "nan" for k in r["metrics"]}
            r["tightness"] = None
        elif how == "all-skip":
            r["status"] = "skip"
        else:
            r["id"] = "other." + r["id"]
    base.write_text(json.dumps(rep))


@pytest.mark.parametrize("cmd", ["audit", "merge"])
@pytest.mark.parametrize("how", ["all-nan", "all-skip", "other-check-ids"])
def test_18_a_baseline_that_compares_nothing_is_undecided(how, cmd, tmp_path, capsys):
    """A --baseline that compared nothing used to report '0 regressions', exit 0."""
    base = tmp_path / "base.json"
    assert main(audit_args("--json", str(base))) == 0
    assert main(audit_args("--baseline", str(base))) == 0          # a real comparison passes
    _hollow_baseline(base, how)
    if cmd == "audit":
        argv = audit_args("--baseline", str(base), "--json", str(tmp_path / "out.json"))
    else:
        s1, s2 = _shards(tmp_path)
        argv = ["report", "merge", str(s1), str(s2), "-o", str(tmp_path / "out.json"), "--baseline", str(base)]
    capsys.readouterr()
    rc, out, err = run(capsys, *argv)
    assert rc == 10, out + err
    bl = json.loads((tmp_path / "out.json").read_text())["baseline"]
    assert bl["compared"] == 0 and bl["undecided"] and not bl["regressions"]
    assert "UNDECIDED" in out


def _case(tmp_path: Path, name: str, **problem) -> Path:
    src = ROOT / "tests" / "regressions" / "masked_rows-twin-window-sum-rule.json"
    case = json.loads(src.read_text())
    case["problem"].update(problem)
    p = tmp_path / name
    p.write_text(json.dumps(case))
    return p


def test_18_replays_of_undecided_cases_exit_10(tmp_path, capsys, monkeypatch):
    """`fuzz --replay pass.json --replay undecided.json` used to exit 0, an undecided case alone 5."""
    from fa4verify import fuzz
    from fa4verify.fuzz.cases import ReplayOutcome

    good, und = _case(tmp_path, "pass.json"), _case(tmp_path, "undecided.json", seqlen_k=2)
    real = fuzz.replay_case

    def replay(case, **kw):
        if case["problem"]["seqlen_k"] == 2:        # the interval could not decide this one
            return ReplayOutcome("undecided", "masked_rows", "interval too wide (simulated)", {})
        return real(case, **kw)

    monkeypatch.setattr(fuzz, "replay_case", replay)
    rc, out, err = run(capsys, "fuzz", "--replay", str(good))
    assert rc == 0, out + err
    rc, out, err = run(capsys, "fuzz", "--replay", str(good), "--replay", str(und))
    assert rc == 10, out + err
    rc, out, err = run(capsys, "fuzz", "--replay", str(und))
    assert rc == 10, out + err


@pytest.mark.parametrize("window", [["a", 3], [5], 5, [1e300, 0], [True, 0], "left"])
def test_18_a_malformed_window_in_a_replay_case_is_exit_2(window, tmp_path, capsys):
    """A malformed window used to be reported as the kernel failing (exit 1) or exit 3."""
    p = _case(tmp_path, "w.json", window_size=window)
    rc, out, err = run(capsys, "fuzz", "--replay", str(p))
    assert rc == 2, out + err
    assert "window_size" in one_line(err, "fa4verify fuzz")


@pytest.mark.parametrize("prop", ["paged_kv_bitwise", "gqa_repeat", "deterministic_bwd"])
def test_18_a_requested_property_that_never_ran_is_exit_5(prop, tmp_path, capsys):
    rc, out, err = run(capsys, "fuzz", "--property", prop, "--examples", "5", "--cache-dir", str(tmp_path))
    if f"never ran: {prop}" in out:
        assert rc == 5, out + err
        assert "nothing ran" in err
    else:
        assert rc == 0 and f"{prop} x" in out, out + err


def test_18_the_plugin_fails_when_every_selected_check_skipped(tmp_path):
    """pytest --fa4verify with every selected audit check skipped used to pass (exit 0)."""
    shutil.copy(OK, tmp_path / "okchecks.py")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fa4verify=quick", "--fa4-only",
            "--fa4-no-default-checks", "--fa4-checks-module", "okchecks.py"]
    r = subprocess.run(base + ["-k", "needs_cuda"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    record("pytest --fa4verify=quick --fa4-only -k needs_cuda (every selected check skips)", r.returncode,
           next((ln for ln in r.stdout.splitlines() if "nothing ran" in ln), r.stdout[-200:]))
    if "1 passed" in r.stdout:
        pytest.skip("fixture.needs_cuda ran: a CUDA GPU is present")
    assert r.returncode == 5, r.stdout + r.stderr
    assert "nothing ran" in r.stdout and "1 skipped" in r.stdout
    r = subprocess.run(base + ["-k", "needs_cuda or lines"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr                  # one check ran: the skip is fine


# ------------------------------------------ 19. bad input: one line, exit 2, before any work
BAD_DEPLOYMENTS = {
    "deeply-nested": ("description = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    "deeply-nested-table": ("x = " + "{a=" * 400 + "1" + "}" * 400, "nested too deeply"),
    "window_sizes-5": ('masks = ["window"]\nwindow_sizes = 5', "window_sizes"),
    "head_dims-1e6": ("head_dims = [1000000]", "head_dims"),
    "nheads-2^62": ("nheads = 4611686018427387904", "nheads"),
    "seqlen-2^63": ("seqlen_q = [1, 9223372036854775807]", "seqlen_q"),
    "window-2^63": ('masks = ["window"]\nwindow_sizes = [[9223372036854775807, 0]]', "window_sizes"),
    "softcap-empty": ("softcap = []", "softcap"),
    "softcap-1e300": ("softcap = 1e300", "softcap"),
    "description-table": ("description = {a = 1}", "description"),
}


@pytest.mark.parametrize("name", sorted(BAD_DEPLOYMENTS))
def test_19_a_malformed_deployment_is_one_line_exit_2(name, tmp_path, capsys):
    body, key = BAD_DEPLOYMENTS[name]
    f = tmp_path / f"{name}.toml"
    f.write_text(f'name = "x"\n{body}\n')
    rc, out, err = run(capsys, "audit", "--no-live", "--profile", "quick", "-k", "budgets.files",
                       "--deployment", str(f), "--json", str(tmp_path / "a.json"))
    assert rc == 2, out + err
    assert key in one_line(err, "fa4verify audit")
    assert not (tmp_path / "a.json").exists()


@pytest.mark.parametrize("cache", ["/dev/null/x", "/proc/x"])
def test_19_an_unusable_kernel_cache_is_one_line_exit_2(cache, tmp_path, capsys):
    rc, out, err = run(capsys, *audit_args("--isolate", "always", "--kernel-cache", cache,
                                           "--json", str(tmp_path / "a.json")))
    assert rc == 2, out + err
    assert "--kernel-cache" in one_line(err, "fa4verify audit")
    assert not (tmp_path / "a.json").exists()


def _typed(rep: dict, where: str, value) -> dict:
    keys = where.split(".")
    d = rep
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[keys[-1]] = value
    return rep


BAD_FIELDS = {"summary.duration_s": "long", "environment": [], "environments": 5, "results.0.duration_s": "x",
              "results.0.tightness": {}, "results.0.summary": ["a"], "fingerprint": "abc",
              "environment.versions": "1.0"}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_19_report_merge_refuses_wrongly_typed_fields(field, tmp_path, capsys):
    s1, s2 = _shards(tmp_path)
    s2.write_text(json.dumps(_typed(json.loads(s2.read_text()), field, BAD_FIELDS[field])))
    capsys.readouterr()
    rc, out, err = run(capsys, "report", "merge", str(s1), str(s2), "-o", str(tmp_path / "m.json"))
    assert rc == 2, out + err
    assert field.split(".")[-1] in one_line(err, "fa4verify report merge")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("field", ["environment", "environment.versions", "config.archs"])
def test_19_a_wrongly_typed_baseline_is_refused_before_the_audit_runs(field, tmp_path):
    """It used to be found after the whole audit ran (here: a check that hangs for 600 s)."""
    base = tmp_path / "base.json"
    assert main(audit_args("--json", str(base))) == 0
    base.write_text(json.dumps(_typed(json.loads(base.read_text()), field, "bad")))
    t0 = time.monotonic()
    r = cli("audit", "--no-default-checks", "--no-live", "--checks-module", HANG, "--isolate", "never",
            "--baseline", str(base), timeout=120)
    assert time.monotonic() - t0 < 100
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--baseline" in one_line(r.stderr, "fa4verify audit")


MALFORMED_CASES = {
    "problem-list": ("problem", [1, 2], "problem"),
    "batch-str": ("batch", "2", "batch"),
    "seqlen-100000": ("seqlen_q", 100000, "8192"),
    "seqlen-2^63": ("seqlen_k", 2**63, "seqlen_k"),
    "softcap-str": ("softcap", "x", "softcap"),
    "scale-negative": ("softmax_scale", -1.0, "softmax_scale"),
    "causal-str": ("causal", "yes", "causal"),
    "mods-int": ("mods", 5, "mods"),
    "values-list": ("values", [], "values"),
    "work-huge": ("nheads", 128, "replay limit"),
    "target-int": ("target", 1, "target"),
    "q-capacity-huge": ("call", {"seqused_q": True, "q_capacity": 1 << 40}, "q_capacity"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_CASES))
def test_19_a_malformed_or_oversized_replay_case_is_one_line_exit_2(name, tmp_path, capsys):
    key, value, fragment = MALFORMED_CASES[name]
    src = ROOT / "tests" / "regressions" / "masked_rows-twin-window-sum-rule.json"
    case = json.loads(src.read_text())
    if key in ("problem", "target"):
        case[key] = value
    elif name == "work-huge":
        case["problem"].update(nheads=128, nheads_kv=128, seqlen_q=8192, seqlen_k=8192, head_dim=128,
                               head_dim_v=128)
    else:
        case["problem"][key] = value
    p = tmp_path / "case.json"
    p.write_text(json.dumps(case))
    t0 = time.monotonic()
    rc, out, err = run(capsys, "fuzz", "--replay", str(p))
    assert time.monotonic() - t0 < 30
    assert rc == 2, out + err
    assert fragment in one_line(err, "fa4verify fuzz")


@pytest.mark.parametrize("opt", ["--deployment", "--checks-module"])
def test_19_a_non_utf8_input_path_is_refused_up_front(opt, tmp_path):
    """It used to run the whole audit, then exit 3 with no report."""
    name = os.fsdecode(b"\xff" + (b".toml" if opt == "--deployment" else b".py"))
    src = FIX / "audit_checks_ok.py" if opt == "--checks-module" else \
        ROOT / "fa4verify" / "data" / "deployments" / "llama3-8b.toml"
    shutil.copy(src, tmp_path / name)
    args = (["--no-default-checks", "--checks-module", name] if opt == "--checks-module"
            else ["--profile", "quick", "-k", "budgets.files", "--deployment", name])
    r = cli("audit", "--no-live", *args, "--json", "a.json", cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert opt in one_line(r.stderr, "fa4verify audit") and "UTF-8" in r.stderr
    assert not (tmp_path / "a.json").exists()


# ----------------------------------------------------------------------------- 20. outputs
def test_20_reports_honour_the_umask_and_never_widen_a_file(tmp_path, capsys):
    """Reports used to be written 0644 under umask 077 and over a 0600 file."""
    new, old = tmp_path / "new.json", write_prev(tmp_path / "old.json")
    os.chmod(old, 0o600)
    mask = os.umask(0o077)
    try:
        assert main(audit_args("--json", str(new), "--html", str(tmp_path / "new.html"))) == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new.html").stat().st_mode) == 0o600
    mask = os.umask(0o022)
    try:
        assert main(audit_args("--json", str(old))) == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and json.loads(old.read_text())["results"]
    capsys.readouterr()
    record("fa4verify audit <OK fixture> --json new.json (umask 077) / --json old.json (a 0600 file)", 0,
           "new.json 0600, old.json stays 0600")


@pytest.mark.parametrize("stdout", ["closed-pipe", "/dev/full"])
def test_20_a_closed_or_full_stdout_never_loses_the_report(stdout, tmp_path):
    """`audit --json r.json | head -n1` used to exit 1 with no JSON; stdout on /dev/full exit 3."""
    if stdout == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    j = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "FA4VERIFY_DEBUG"}
    argv = [sys.executable, "-m", "fa4verify", *audit_args("--json", str(j))]
    if stdout == "closed-pipe":
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        p.stdout.close()                                  # the reader is gone (head -n1 finished)
        err = p.stderr.read().decode()
        rc = p.wait(timeout=300)
    else:
        with open("/dev/full", "w") as full:
            r = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
        rc, err = r.returncode, r.stderr
    record(f"fa4verify audit <OK fixture> --json r.json (stdout: {stdout})", rc, err)
    assert rc == 0, err
    assert "Traceback" not in err and "internal error" not in err
    assert json.loads(j.read_text())["summary"]["exit_code"] == 0


_SIGNAL_WRITER = """
import os, signal, sys
from fa4verify.audit import atomic
sig, when, d = getattr(signal, sys.argv[1]), sys.argv[2], sys.argv[3]
signal.signal(sig, signal.SIG_DFL)     # a parent that ignores it (nohup: SIGHUP) is not the case here
real_replace, real_temp, n = os.replace, atomic._write_temp, [0]
def replace(src, dst):
    real_replace(src, dst)
    if when == "between-renames" and dst.endswith("a.json"):
        os.kill(os.getpid(), sig)
def write_temp(path, data):
    t = real_temp(path, data)
    if when == "before-renames" and path.endswith("b.html"):
        os.kill(os.getpid(), sig)
    return t
atomic.os.replace, atomic._write_temp = replace, write_temp
atomic.write_all([(os.path.join(d, n), b"new") for n in ("a.json", "b.html", "c.xml")])
"""


@pytest.mark.parametrize("when", ["between-renames", "before-renames"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_20_a_report_set_is_all_or_none_under_sigterm_and_sighup(sig, when, tmp_path):
    """SIGTERM between the renames used to leave new JSON + old HTML and two .tmp files."""
    for n in ("a.json", "b.html", "c.xml"):
        write_prev(tmp_path / n)
    r = subprocess.run([sys.executable, "-c", _SIGNAL_WRITER, sig, when, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    contents = {n: (tmp_path / n).read_text() for n in ("a.json", "b.html", "c.xml")}
    record(f"{sig} {when.replace('-', ' ')} of write_all(a.json, b.html, c.xml)", r.returncode,
           f"{sorted(set(contents.values()))} {r.stderr.strip()[-100:]}")
    assert r.returncode == -getattr(signal, sig), r.stderr                 # the signal still ends it
    assert set(contents.values()) == {"new"}, contents                     # all new, delivered after
    no_temp_files(tmp_path)


def test_20_two_audits_never_write_one_report_set(tmp_path, capsys):
    """Two audits writing the same outputs used to interleave them (JSON of one, HTML of the other)."""
    j, h = tmp_path / "a.json", tmp_path / "a.html"
    first = subprocess.Popen([sys.executable, "-m", "fa4verify", "audit", "--no-default-checks", "--no-live",
                              "--checks-module", HANG, "--isolate", "never", "--json", str(j), "--html", str(h)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = tmp_path / ".a.json.fa4verify-lock"
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().strip() == str(first.pid)):   # the holder's marker
            assert first.poll() is None and time.monotonic() < deadline, "the first audit never took the lock"
            time.sleep(0.05)
        rc, out, err = run(capsys, *audit_args("--html", str(h), "--json", str(j)))
        assert rc == 2
        line = one_line(err, "fa4verify audit")
        assert "another fa4verify" in line and str(first.pid) in line
        assert not j.exists() and not h.exists()
    finally:
        first.kill()
        first.wait(timeout=60)
    assert main(audit_args("--json", str(j), "--html", str(h))) == 0       # a stale lock file is no lock
    assert not lock.exists()


# ------------------------------------------------------------------------ 21. the kernel cache
@pytest.mark.parametrize("how", ["world-writable", "group-writable", "foreign-owned", "preset-env-0777"])
def test_21_an_unsafe_kernel_cache_is_refused(how, tmp_path, capsys, monkeypatch):
    """A 0777 cache directory (FA4 links the objects in it into the process) was used without a word."""
    kc = tmp_path / "kc"
    kc.mkdir()
    for k in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    if how == "group-writable":
        os.chmod(kc, 0o770)
    elif how == "foreign-owned":
        if os.getuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(kc, 65534, 65534)
    else:
        os.chmod(kc, 0o777)
    args = ["--kernel-cache", str(kc)]
    if how == "preset-env-0777":
        monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
        monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(kc))
        args = []
    rc, out, err = run(capsys, *audit_args("--isolate", "always", *args, "--json", str(tmp_path / "a.json")))
    assert rc == 2, out + err
    line = one_line(err, "fa4verify audit")
    assert str(kc) in line and ("writable" in line or "owned by" in line), line
    assert not (tmp_path / "a.json").exists()


def test_21_a_preset_fa4_cache_setting_is_named_not_silently_used(tmp_path, capsys, monkeypatch):
    """A preset FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 used to replace --kernel-cache silently (the
    report still named the user's directory)."""
    mine, preset = tmp_path / "mine", tmp_path / "preset"
    preset.mkdir(mode=0o700)
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(preset))
    j = tmp_path / "a.json"
    rc, out, err = run(capsys, *audit_args("--kernel-cache", str(mine), "--json", str(j)))
    assert rc == 0, out + err
    assert json.loads(j.read_text())["config"]["kernel_cache"] == str(preset)
    note = [ln for ln in err.splitlines() if "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1" in ln]
    assert note and "--kernel-cache" in note[0] and str(preset) in note[0], err


_PLANT = r"""
import hashlib, json, os, sys
from fa4verify.kernels import adapter
from flash_attn.cute import cache_utils as cu
interface = adapter.fa4_interface()          # the adapter's first use of FA4
loaded = []
def load_module(path, enable_tvm_ffi=True):  # what FA4 would dlopen: recorded, never run
    loaded.append([path, open(path, "rb").read().decode()])
    return type("M", (), {"func": staticmethod(lambda *a: None)})
cu.cute.runtime.load_module = load_module
c = interface._flash_attn_fwd.compile_cache
out = {"path": str(c.cache_path)}
def plant(key, data, manifest=None):
    obj = c.cache_path / f"{c._key_to_hash(key)}.o"
    obj.write_bytes(data)
    if manifest is not None:
        (obj.parent / (obj.name + ".sha256")).write_text(manifest)
    return key in c
out["planted"] = plant(("planted",), b"planted")
out["wrong_manifest"] = plant(("wrong",), b"swapped", hashlib.sha256(b"original").hexdigest())
out["right_manifest"] = plant(("right",), b"exported", hashlib.sha256(b"exported").hexdigest())
out["loaded"] = loaded
with adapter.exp2_emulation_disabled():      # raised with the cache on
    out["inside"] = str(interface._flash_attn_fwd.compile_cache.cache_path)
out["after"] = str(interface._flash_attn_fwd.compile_cache.cache_path)
print(json.dumps(out))
"""


@pytest.mark.fa4
def test_21_a_planted_kernel_object_is_never_loaded(tmp_path):
    """An object planted at a key's path in FA4's persistent cache was linked into the process;
    the cache path carried no arch; exp2_emulation_disabled() raised with the cache on."""
    kc = tmp_path / "kc"
    kc.mkdir(mode=0o700)
    env = dict(os.environ, FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1", FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(kc),
               CUTE_DSL_ARCH="sm_100a")
    r = subprocess.run([sys.executable, "-c", _PLANT], capture_output=True, text=True, env=env, timeout=300,
                       preexec_fn=lambda: os.umask(0o002))     # a umask that makes group-writable dirs
    record("object planted at a key's path of FA4's persistent cache (no / wrong / right manifest)",
           r.returncode, (r.stderr.strip().splitlines() or [""])[0])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["planted"] is False and out["wrong_manifest"] is False        # refused: recompiled
    assert out["right_manifest"] is True
    assert [d for _, d in out["loaded"]] == ["exported"]                     # the only object loaded
    assert not out["loaded"][0][0].startswith(str(kc))                      # from a private copy
    assert "no integrity manifest" in r.stderr and "differs from its manifest" in r.stderr
    rel = Path(out["path"]).relative_to(kc)
    assert rel.parts[0] == "sm100a" and rel.parts[-1] == "fwd"              # the arch in the path
    assert out["inside"] == out["path"] + "-ex2emu-off" and out["after"] == out["path"]
    modes = {str(d.relative_to(kc)): stat.S_IMODE(d.stat().st_mode) for d in kc.rglob("*") if d.is_dir()}
    assert modes and set(modes.values()) == {0o700}, modes               # private whatever the umask
    assert "writable" not in r.stderr, r.stderr


# ----------------------------------------------------------------------------- 22. mod pairs
def _mask_pair(name, keep):
    from fa4verify.kernels.mods import ModPair

    return ModPair(name, "mask", lambda b, h, qi, ki, aux: np.broadcast_to(keep(b, h, qi, ki), np.broadcast(qi, ki).shape))


def _score_pair(name, err, ref=lambda x, b, h, qi, ki, aux: x + 0.25):
    from fa4verify.kernels.mods import ModPair

    return ModPair(name, "score", ref, grad=lambda x, *r: np.ones_like(x), err=err)


HOSTILE_PAIRS = {
    "mask-differs-for-heads>=2": (lambda: _mask_pair("hostile_heads", lambda b, h, qi, ki: (ki <= qi) | (h >= 2)),
                                  "depends on the head"),
    "mask-differs-past-a-tile-edge": (lambda: _mask_pair("hostile_edge",
                                                         lambda b, h, qi, ki: (ki <= qi) | ((h == 1) & (ki >= 128))),
                                      "depends on the head"),
    "err-1.0": (lambda: _score_pair("hostile_err", lambda x, y, *r: np.ones_like(x)), "err"),
    "err-passes-negation": (lambda: _score_pair("hostile_neg", lambda x, y, *r: 2.0 * np.abs(y) + 1e-6), "err"),
    "name-trailing-newline": (lambda: _score_pair("a\n", lambda x, y, *r: 2.0 ** -24 * (np.abs(x) + 0.25)),
                              "must match"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PAIRS))
def test_22_hostile_mod_pairs_are_refused(case):
    """A mask differing only for heads >= 2 passed validate (heads 0 and 1 compared); err=1.0 was
    accepted (the gate then passed the negated output); the name "a\\n" was accepted."""
    from fa4verify import mods

    make, fragment = HOSTILE_PAIRS[case]
    pair = make()
    with pytest.raises(errors.ModPairError) as ei:
        mods.register_mod_pair(pair)
    msg = str(ei.value)
    record(f"register_mod_pair({case})", "ModPairError", msg)
    assert fragment in msg and "\n" not in msg, msg
    assert pair.name not in mods.names()


def test_22_every_builtin_pair_passes_the_full_sweep():
    """The sweep (Note [Mod pairs on every class]) is not run at import for the built-ins; here."""
    from fa4verify import mods
    from fa4verify.kernels.mods import library

    for p in library():
        assert mods.validate(p) is p
    ok = _score_pair("user_fine_bias", lambda x, y, *r: 2.0 ** -24 * (np.abs(x) + 0.25))
    assert mods.register_mod_pair(ok) is ok            # a sound err passes
    mods.unregister("user_fine_bias")


# ------------------------------------------------------------------------------ 23. cosmetic
@pytest.mark.parametrize("columns", ["0"])
def test_23_an_unusable_columns_prints_normally(columns, tmp_path):
    """COLUMNS=0 printed nothing."""
    r = cli(*audit_args("--json", str(tmp_path / "a.json")), env={"COLUMNS": columns}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "PASSED" in r.stdout and "fixture.dot.bf16" in r.stdout, r.stdout


def test_23_control_bytes_from_a_report_never_reach_the_terminal(tmp_path, capsys):
    """ESC bytes and newlines from a report reached the terminal (a crafted report could draw a
    fake PASS row)."""
    j = tmp_path / "a.json"
    assert main(audit_args("--json", str(j))) == 0
    rep = json.loads(j.read_text())
    r0 = rep["results"][0]
    r0.update(status="fail", id=r0["id"] + "\x1b[1A", summary="\x1b[2J\x1b[32mPASS\nPASS  fake.row\x07",
              metrics={"max_ulp\x1b[0m": 1.0}, where="CPU\x9b31m")
    rep["config"]["dtype"] = "bf16\x1b]0;title\x07"
    j.write_text(json.dumps(rep))
    capsys.readouterr()
    rc, out, err = run(capsys, "report", "show", str(j))
    assert rc == 0                                     # the recorded exit code
    for bad in ("\x1b", "\x07", "\x9b"):
        assert bad not in out + err, repr(bad)
    assert "\\x1b[2J" in out and not any(ln.lstrip("│ ").startswith("PASS  fake.row") for ln in out.splitlines())


def test_23_error_lines_are_capped(tmp_path, capsys):
    """An error message of 830 KB went to the terminal on one line."""
    f = tmp_path / "big.toml"
    f.write_text('name = "x"\n' + "".join(f"k{i} = {i}\n" for i in range(20000)))
    rc, out, err = run(capsys, "audit", "--no-live", "--profile", "quick", "-k", "budgets.files",
                       "--deployment", str(f))
    assert rc == 2
    line = one_line(err, "fa4verify audit")
    assert len(line) <= 600 and line.endswith("…"), len(line)


def test_23_fa4verify_debug_0_means_off(capsys, monkeypatch):
    """FA4VERIFY_DEBUG=0 enabled tracebacks."""
    import fa4verify.cli.exp2 as E

    def boom(*a, **k):
        raise RuntimeError("simulated crash in the sweep")

    monkeypatch.setattr(E, "run_exp2", boom)
    for off in ("0", "false", "off", ""):
        monkeypatch.setenv("FA4VERIFY_DEBUG", off)
        rc, out, err = run(capsys, "exp2", "--sample", "10")
        assert rc == 3 and "internal error" in one_line(err)
    monkeypatch.setenv("FA4VERIFY_DEBUG", "1")
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["exp2", "--sample", "10"])


def test_19_a_deeply_nested_deployment_is_a_usage_error_under_pytest(tmp_path):
    """It was an INTERNALERROR under pytest --fa4verify."""
    (tmp_path / "deep.toml").write_text('name = "x"\ndescription = ' + "[" * 5000 + "]" * 5000 + "\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--fa4verify=quick",
                        "--fa4-only", "--fa4-deployment", "deep.toml", "-k", "budgets.files"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    record("pytest --fa4verify=quick --fa4-deployment deep.toml (5000 nested arrays)", r.returncode, r.stderr)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]                 # pytest's usage error
    assert "INTERNALERROR" not in r.stdout + r.stderr and "nested too deeply" in r.stderr


_VARIANT = r"""
import json
from fa4verify.audit import kernel_timing
kernel_timing.install()                      # as in an audit worker: FA4's caches behind counting proxies
from fa4verify.kernels import adapter
interface = adapter.fa4_interface()
c = interface._flash_attn_fwd.compile_cache
with adapter.exp2_emulation_disabled():
    v = interface._flash_attn_fwd.compile_cache
    inside = [type(v).__name__, str(v._inner.cache_path), v._name]
print(json.dumps({"outer": [type(c).__name__, str(c._inner.cache_path)], "inside": inside,
                  "restored": interface._flash_attn_fwd.compile_cache is c}))
"""


@pytest.mark.fa4
def test_21_emulation_off_kernels_persist_apart_in_an_audit_worker(tmp_path):
    """In a worker (FA4's caches behind kernel_timing's proxies) the emulation-off forward gets a
    persistent cache of its own, still counted -- not an in-memory one recompiled every audit."""
    kc = tmp_path / "kc"
    kc.mkdir(mode=0o700)
    env = dict(os.environ, FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1", FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(kc))
    r = subprocess.run([sys.executable, "-c", _VARIANT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["outer"][0] == out["inside"][0] == "TimedCache" and out["restored"]
    assert out["inside"][1] == out["outer"][1] + "-ex2emu-off" and out["inside"][2].endswith("-ex2emu-off")
