"""The release table (scripts/release_table.py) and the blame of a report row (Note [Blame of a
report row]) on reports fabricated here with the report writer itself; and the device step
scripts/gpu/releases.sh (Note [Release runs]) on the CPU with a fabricated release wheel: the
release shadows the installed one, the audit's refusal (no CUDA here) is recorded, a release
with nothing to run and one past the deadline are named, and the table says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from fa4verify import blame
from fa4verify.audit import report_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "release_table.py")

FA4_TB = ('Traceback (most recent call last):\n'
          '  File "/repo/fa4verify/run/worker.py", line 90, in run_task\n'
          '  File "/repo/kernels/adapter.py", line 170, in _call_fa4\n'
          '  File "/root/site/flash_attn/cute/interface.py", line 900, in _flash_attn_bwd\n'
          '  File "/root/site/nvidia_cutlass_dsl/python_packages/cutlass/base_dsl/jit.py", line 12, in f\n'
          'RuntimeError: an FA4 failure\n')
OWN_TB = ('Traceback (most recent call last):\n'
          '  File "/repo/fa4verify/run/worker.py", line 90, in run_task\n'
          '  File "/repo/kernels/adapter.py", line 170, in _call_fa4\n'
          '  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/functional.py", line 5, in g\n'
          'TypeError: an fa4verify bug\n')


def _row(cid, status, summary, needs=("cuda", "fa4"), **details):
    return {"id": cid, "check_id": cid, "title": cid, "module": "x", "arch": "sm90", "needs": list(needs),
            "status": status, "where": "measured on NVIDIA H200 (sm_90)", "summary": summary, "metrics": {},
            "details": details, "tightness": None, "duration_s": 1.0, "isolated": True, "notes": []}


def _report(release, results, *, dsl="4.8.1", mismatch=()):
    env = {"versions": {"FA4": release, "CuTe DSL": dsl},
           "hardware": {"gpu_name": "NVIDIA H200"},
           "stack": {"release": release, "installed": {"nvidia-cutlass-dsl": dsl, "quack-kernels": "0.6.5"},
                     "requires": {}, "mismatch": list(mismatch)}}
    code = 1 if any(r["status"] == "fail" for r in results) else 0
    return report_json.build_report(config={"dtype": "bf16", "device": "cuda", "profile": "default", "seed": 0},
                                    environment=env, results=results, exit_code=code, duration_s=123.4)


def _write(path, rep):
    path.write_text(report_json.dumps(rep))
    return str(path)


SEQ_FAILURE = {"property": "fwd_budget.out", "message": "out of budget", "kind": "sequence bug", "length": 2,
               "describe": ["fwd b1 s128/128 h2/2 d64 softcap=5", "fwd b1 s128/128 h2/2 d64 softcap=30"],
               "case_file": "/tmp/fa4v-seq-x/seq_abc.json", "calls": []}


def _state(tmp_path):
    st = tmp_path / "state"
    (st / "runs").mkdir(parents=True)
    _write(st / "4.0.0b35.json", _report("4.0.0b35", [
        _row("budgets.files", "pass", "8 budget files", needs=("cpu",)),
        _row("sequences.production", "fail", "fwd_budget.out violated on call 2 of a 2-call sequence",
             failure=SEQ_FAILURE),
        _row("races.production", "error", "1/2 case(s) did not finish: case 1/2 (x): did not finish in 300 s "
             "(killed with its worker)"),
        _row("determinism.fa4", "error", "RuntimeError: an FA4 failure", traceback=FA4_TB),
        _row("budgets.production.backward", "error", "TypeError: an fa4verify bug", traceback=OWN_TB),
        _row("fuzz.production", "undecided", "judged 2 of 50 examples (48 unsupported); a verdict needs at least 50%"),
        _row("coverage.production", "skip", "FA4 4.0.0b35 has no paged KV"),
        _row("exp2.deg5", "skip", "not in this profile", needs=("cpu",)),
    ]))
    # the report of another release under this release's name: the row must say so
    _write(st / "4.0.0b34.json", _report("4.0.0b36", [_row("budgets.files", "pass", "ok", needs=("cpu",))]))
    _write(st / "4.0.0b25.json", _report("4.0.0b25", [_row("budgets.files", "pass", "ok", needs=("cpu",))],
                                         dsl="4.8.1", mismatch=["nvidia-cutlass-dsl 4.8.1 installed; "
                                                                "flash-attn-4 4.0.0b25 requires nvidia-cutlass-dsl==4.6.0.dev0"]))
    (st / "runs" / "4.0.0b33.txt").write_text("release=4.0.0b33 rc=124 wall=330 cap=330 workers=8\n")
    (st / "runs" / "4.0.0b20.txt").write_text("release=4.0.0b20 rc=not-run wall=0 cap=0 note=no wheel here\n")
    (st / "runs" / "4.0.0b35.txt").write_text("release=4.0.0b35 rc=1 wall=150 cap=330 workers=8\n")
    return st


def _table(*args):
    cp = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    return cp


def _rows(text, first):
    return [line for line in text.splitlines() if line.startswith(f"| {first} |")]


def test_report_blame_follows_note_blame():
    # a coverage hole from a row the release refuses is fa4verify's; a violation beside it FA4's
    where = "measured on NVIDIA H200 (sm_90)"
    holes = "covered 1030/1066 ...; 36 HOLE(S), first: form=block_sparse; row 22 refused: FA4 rejected the call: ValueError"
    assert blame.report_blame({"status": "fail", "summary": holes, "where": where}).startswith("fa4verify")
    assert blame.report_blame({"status": "fail", "summary": holes + "; runs violated, shrunk to x", "where": where}) \
        == "FA4 (violation) and fa4verify (holes: planned rows this FA4 release refuses)"
    assert blame.report_blame({"status": "fail", "summary": "1 HOLE(S), first: form=dense", "where": where}) == "FA4"
    assert blame.report_blame({"status": "fail", "summary": "x", "where": "measured on NVIDIA H200 (sm_90)"}) == "FA4"
    assert blame.report_blame({"status": "fail", "summary": "x", "where": "CPU twin"}) == "FA4 (as the CPU twin models it)"
    assert blame.report_blame({"status": "fail", "summary": "installed release not as modelled", "where": "CPU"}
                              ) == "fa4verify"
    assert blame.report_blame({"status": "undecided", "summary": "x"}) == "no verdict"
    assert blame.report_blame({"status": "pass"}) == "-"
    assert blame.report_blame({"status": "error", "summary": "y", "details": {"traceback": FA4_TB}}) == "FA4"
    assert blame.report_blame({"status": "error", "summary": "y", "details": {"traceback": OWN_TB}}) == "fa4verify"
    assert blame.report_blame({"status": "error", "summary": "no traceback at all"}) == "fa4verify"
    assert blame.report_blame({"status": "error", "summary": "fa4verify's own call failed on 3 call(s)",
                               "details": {"traceback": FA4_TB}}) == "fa4verify"
    assert blame.report_blame({"status": "error", "summary": "RuntimeError: CUDA error: an illegal memory access "
                               "was encountered", "details": {"traceback": OWN_TB}}) == "FA4"
    assert blame.report_blame({"status": "error", "summary": "did not finish in 45 s (killed with its worker)"}
                              ).startswith("undetermined")
    assert blame.path_owner("/x/lib/python3.12/site-packages/flash_attn/cute/interface.py") == "fa4"
    assert blame.path_owner("/work/main/kernels/adapter.py") == "fa4verify"
    assert blame.path_owner("/x/site-packages/torch/kernels/y.py") is None


def test_release_table_rows(tmp_path):
    st = _state(tmp_path)
    cp = _table("--state", str(st), "--markdown", str(tmp_path / "t.md"))
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert (tmp_path / "t.md").read_text() == out
    # newest first, one summary row per release, with or without a report
    order = [line.split("|")[1].strip() for line in out.splitlines()
             if line.startswith("| 4.0.0b") and line.count("|") == 11]
    assert order == ["4.0.0b35", "4.0.0b34", "4.0.0b33", "4.0.0b25", "4.0.0b20"]
    b35 = _rows(out, "4.0.0b35")[0]
    cells = [c.strip() for c in b35.split("|")[1:-1]]
    assert cells[1] == "FA4 4.0.0b35, DSL 4.8.1, quack 0.6.5 (matches its metadata)"
    assert cells[2:8] == ["1", "1", "1", "3", "2", "1"]         # pass fail undecided error skip exit
    assert "REPORT IS FOR 4.0.0b36" in _rows(out, "4.0.0b34")[0]
    assert "killed at its cap of 330 s" in _rows(out, "4.0.0b33")[0]
    assert "not run: no wheel here" in _rows(out, "4.0.0b20")[0]
    assert "MISMATCHED STACK: nvidia-cutlass-dsl 4.8.1 installed" in _rows(out, "4.0.0b25")[0]
    # the findings: every non-pass check of b35 but the CPU skip, with reason, reproducer and blame
    found = {c[1]: c for c in ([x.strip() for x in r.split("|")[1:-1]] for r in _rows(out, "4.0.0b35"))
             if len(c) == 6}
    assert set(found) == {"sequences.production", "races.production", "determinism.fa4",
                          "budgets.production.backward", "fuzz.production", "coverage.production"}
    seq = found["sequences.production"]
    assert seq[2] == "fail" and seq[5] == "FA4"
    assert seq[4] == ("fwd b1 s128/128 h2/2 d64 softcap=5 -> fwd b1 s128/128 h2/2 d64 softcap=30 "
                      "(sequence bug, 2 calls, seq_abc.json)")
    assert found["determinism.fa4"][5] == "FA4"
    assert found["budgets.production.backward"][5] == "fa4verify"
    assert found["races.production"][5].startswith("undetermined")
    assert found["fuzz.production"][2:4] == ["undecided", "judged 2 of 50 examples (48 unsupported); a verdict "
                                                          "needs at least 50%"]
    assert found["fuzz.production"][5] == "no verdict"
    assert found["coverage.production"][4] == "-"


def test_release_table_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "4.0.0b30.json"
    bad.write_text(json.dumps({"schema": "something else"}))
    for args in ([str(bad)], [str(tmp_path / "missing.json")], ["--state", str(tmp_path / "nope")], []):
        cp = _table(*args)
        assert cp.returncode == 2, (args, cp.stdout)
        assert len(cp.stderr.strip().splitlines()) == 1 and cp.stderr.startswith("release_table: ")


def _fake_wheel(d, version, dsl=None):
    """A wheel of flash-attn-4 ``version``: its metadata (pinning nvidia-cutlass-dsl ``dsl``) and an
    empty flash_attn package."""
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"flash_attn_4-{version}-py3-none-any.whl"
    req = f"Requires-Dist: nvidia-cutlass-dsl=={dsl}\nRequires-Dist: torch\n" if dsl else ""
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("flash_attn/__init__.py", "")
        z.writestr(f"flash_attn_4-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: flash-attn-4\nVersion: {version}\n{req}")
        z.writestr(f"flash_attn_4-{version}.dist-info/RECORD", "")
    return p


def _fake_stack(root, version, dsl="0.0.2"):
    """A two-part bundle as ../shared/device/make_bundle.sh writes it, of a fake stack: part1 a
    DSL-like package with 2.5 MB of incompressible bytes (several 1 MB chunks), part2 flash-attn-4
    ``version``."""
    import io
    import tarfile
    for part, files in (("part1", {"nvidia_cutlass_dsl/python_packages/cutlass/__init__.py": b"",
                                   "nvidia_cutlass_dsl/lib/blob.bin": os.urandom(2_500_000)}),
                        ("part2", {"flash_attn/__init__.py": b"",
                                   f"nvidia_cutlass_dsl-{dsl}.dist-info/METADATA":
                                       f"Metadata-Version: 2.1\nName: nvidia-cutlass-dsl\nVersion: {dsl}\n".encode(),
                                   f"flash_attn_4-{version}.dist-info/METADATA":
                                       f"Metadata-Version: 2.1\nName: flash-attn-4\nVersion: {version}\n".encode()})):
        (root / part).mkdir(parents=True)
        with tarfile.open(root / part / ("p1.tar.xz" if part == "part1" else "p2.tar.xz"), "w:xz") as t:
            for name, data in files.items():
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return root


def _bash(args, env, timeout=300):
    return subprocess.run(["bash", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def test_stack_chunks_split_and_stage(tmp_path):
    """A stack cut into chunk folders here and staged on the 'device' chunk by chunk: nothing is
    unpacked until every chunk of the manifest is there and checks; then the stack's site holds
    both parts; a corrupted chunk is refused."""
    src = _fake_stack(tmp_path / "bundle", "9.9.9b2")
    env = dict(os.environ, STACK_SRC=str(tmp_path / "tree"), STACK_ROOT=str(tmp_path / "dev"), CHUNK_MB="1")
    cp = _bash(["scripts/gpu/stack_chunks.sh", "split", "9.9.9b2", str(src)], env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    chunks = sorted((tmp_path / "tree" / "stack-9.9.9b2").iterdir())
    assert len(chunks) >= 3 and all((c / "manifest.sha256").is_file() for c in chunks)
    assert all(sum(f.stat().st_size for f in c.iterdir()) <= 1_100_000 for c in chunks)
    # the first call carries the first chunk only
    held = tmp_path / "held"
    held.mkdir()
    for c in chunks[1:]:
        c.rename(held / c.name)
    cp = _bash(["scripts/gpu/stack_chunks.sh", "stage"], env)
    assert "waiting for chunk(s)" in cp.stdout and not (tmp_path / "dev" / "site-9.9.9b2").exists()
    # the next call carries the rest; the first chunk's folder is gone from the tree by then
    chunks[0].rename(held / ("gone-" + chunks[0].name))
    for c in chunks[1:]:
        (held / c.name).rename(c)
    cp = _bash(["scripts/gpu/stack_chunks.sh", "stage"], env)
    site = tmp_path / "dev" / "site-9.9.9b2"
    assert "unpacked in" in cp.stdout, cp.stdout
    assert (site / "nvidia_cutlass_dsl" / "lib" / "blob.bin").stat().st_size == 2_500_000
    assert (site / "flash_attn_4-9.9.9b2.dist-info" / "METADATA").is_file() and (site / ".complete").is_file()
    # a corrupted chunk: refused, nothing unpacked
    env2 = dict(env, STACK_ROOT=str(tmp_path / "dev2"))
    (held / ("gone-" + chunks[0].name)).rename(chunks[0])
    victim = next(f for f in chunks[-1].iterdir() if f.name != "manifest.sha256")
    victim.write_bytes(b"x" + victim.read_bytes()[1:])
    cp = _bash(["scripts/gpu/stack_chunks.sh", "stage"], env2)
    assert "does not match its manifest" in cp.stdout and not (tmp_path / "dev2" / "site-9.9.9b2").exists()


@pytest.mark.slow
def test_releases_step_on_the_cpu(tmp_path):
    """scripts/gpu/releases.sh here: the fabricated release is unpacked and shadows the installed
    FA4 (the preflight sees its version), its audit refuses (no CUDA: exit 2, no report) and the
    run record and table say so; a release whose own stack was staged runs on that stack, and so
    does a wheel pinning that stack's DSL; a wheel pinning a DSL nothing here holds and a release
    with neither wheel nor stack are 'not run'; with too little time left nothing starts."""
    rd = tmp_path / "rels"
    _fake_wheel(rd, "9.9.9b1")
    _fake_wheel(rd, "9.9.9b3", dsl="0.0.1")      # pins a DSL nothing here holds: not run
    _fake_wheel(rd, "9.9.9b4", dsl="0.0.2")      # pins the staged stack's DSL: runs on that stack
    tree = tmp_path / "tree"
    env0 = dict(os.environ, STACK_SRC=str(tree), STACK_ROOT=str(tmp_path / "dev"), CHUNK_MB="1")
    cp = _bash(["scripts/gpu/stack_chunks.sh", "split", "9.9.9b2", str(_fake_stack(tmp_path / "b", "9.9.9b2"))], env0)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out, state = tmp_path / "out", tmp_path / "state"
    env = dict(env0, OUT=str(out), RELEASE_DIR=str(rd), RELEASE_STATE=str(state),
               RELEASES="9.9.9b1,9.9.9b0,9.9.9b2,9.9.9b3,9.9.9b4", RELEASE_MIN_S="5", RELEASE_CAP_S="120",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cp = _bash(["scripts/gpu/releases.sh"], env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    rec = (state / "runs" / "9.9.9b1.txt").read_text()
    assert rec.startswith("release=9.9.9b1 rc=2 "), rec       # the audit ran (shadowed release) and refused
    assert "no CUDA device" in (state / "9.9.9b1.log").read_text()
    assert (state / "site" / "9.9.9b1" / "flash_attn_4-9.9.9b1.dist-info").is_dir()
    rec2 = (state / "runs" / "9.9.9b2.txt").read_text()
    assert rec2.startswith("release=9.9.9b2 rc=2 "), rec2     # the staged stack's release, seen by its metadata
    assert "stack 9.9.9b2: unpacked in" in (out / "progress.txt").read_text()
    assert "rc=not-run" in (state / "runs" / "9.9.9b0.txt").read_text()
    rec3 = (state / "runs" / "9.9.9b3.txt").read_text()
    assert "rc=not-run" in rec3 and "pins nvidia-cutlass-dsl==0.0.1" in rec3, rec3
    rec4 = (state / "runs" / "9.9.9b4.txt").read_text()
    assert rec4.startswith("release=9.9.9b4 rc=2 "), rec4     # its wheel before the staged stack
    table = (out / "table.md").read_text()
    assert "| 9.9.9b1 |" in table and "the audit exited 2" in table
    assert "| 9.9.9b0 |" in table and "not run: no wheel" in table
    assert (out / "releases.tgz").stat().st_size > 0
    # with less time left than RELEASE_MIN_S, nothing starts
    env2 = dict(env, OUT=str(tmp_path / "out2"), RELEASE_MIN_S="100",
                RELEASE_DEADLINE=str(int(time.time()) + 50))
    cp = _bash(["scripts/gpu/releases.sh"], env2, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "9.9.9b1: not started" in (tmp_path / "out2" / "progress.txt").read_text()
