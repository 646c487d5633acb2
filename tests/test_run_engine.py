"""The execution engine (fa4verify.run, Note [One engine]): cases planned by FA4 compile key and
queued longest first, the verdict independent of where the cases ran, a crashed or hung case an
error of its check only (naming the problem, the report written), workers that die with the
audit (kill -9 included) and never import from the working directory. CPU only: fixture checks
(tests/fixtures/audit_checks_cases.py), isolated with ``--isolate always``, and fuzz.twin."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fa4verify.audit.registry import CheckContext, discover
from fa4verify.cli import main
from fa4verify.kernels.adapter import compile_key
from fa4verify.run.engine import Job, MIN_DEADLINE_S, plan, task_deadline

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "audit_checks_cases.py")


def audit(tmp_path, *args: str, name: str = "a.json") -> tuple[int, dict]:
    j = tmp_path / name
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", FIX,
                 "--json", str(j), *args])
    return code, {r["id"]: r for r in json.loads(j.read_text())["results"]}


@pytest.fixture(scope="module")
def specs():
    return {s.id: s for s in discover(modules=[FIX], include_package=False)}


# ------------------------------------------------------------------------------ plan
def test_plan_groups_the_cases_of_one_compile_key_and_queues_the_longest_first(specs):
    grid, crash = specs["fixture.cases.grid"], specs["fixture.cases.crash"]
    ctx = CheckContext()
    jobs = [Job(crash, ctx, cases=list(crash.cases(ctx))), Job(grid, ctx, cases=list(grid.cases(ctx))),
            Job(specs["fixture.cases.verdict"], ctx, cases=None)]
    tasks = plan(jobs)
    assert [t.cost for t in tasks] == sorted((t.cost for t in tasks), reverse=True)
    assert tasks[0].job == 1                    # the costliest check's groups come first
    for i, job in enumerate(jobs[:2]):
        mine = [t for t in tasks if t.job == i]
        assert sorted(j for t in mine for j in t.cases) == list(range(len(job.cases)))   # each case once
        keys = [{compile_key(job.cases[j]) for j in t.cases} for t in mine]
        assert all(len(k) == 1 for k in keys)                       # one compile key per task
        assert len({next(iter(k)) for k in keys}) == len(mine)      # and one task per key
    assert len([t for t in tasks if t.job == 1]) == 6               # 12 cases, 6 keys
    assert [t.cases for t in tasks if t.job == 2] == [None]         # a whole check: one task
    assert abs(sum(t.cost for t in tasks if t.job == 1) - grid.cost) < 1e-9   # its cost, split


def test_a_heavier_case_is_queued_first_and_the_cost_is_split_by_weight(specs):
    from types import SimpleNamespace
    from fa4verify.run.engine import case_weight
    grid, ctx = specs["fixture.cases.grid"], CheckContext()
    cases = [SimpleNamespace(n=0), SimpleNamespace(n=1, queue_weight=9.0), SimpleNamespace(n=2, queue_weight=2.0)]
    assert [case_weight(c) for c in cases] == [1.0, 9.0, 2.0]
    tasks = plan([Job(grid, ctx, cases=cases)])
    assert [t.cases for t in tasks] == [(1,), (2,), (0,)]          # no compile key: a task each
    assert [round(t.cost / grid.cost, 6) for t in tasks] == [round(x / 15, 6) for x in (10, 3, 2)]


def test_a_planned_row_of_many_sequences_weighs_more_than_a_plain_one():
    from fa4verify.checks.fuzz import DrawnCase
    from fa4verify.problem import AttentionProblem
    plain = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=64, seqlen_k=64, nheads=2,
                             nheads_kv=2, head_dim=64, head_dim_v=64)
    many = plain.replace(batch=257, seqlens_q=(3,) * 257, seqlens_k=(5,) * 257, seqlen_q=3, seqlen_k=5)
    big = plain.replace(batch=2, seqlen_q=389, seqlen_k=439, nheads=8, nheads_kv=2, head_dim=96, head_dim_v=96)
    w = {(p, b): DrawnCase(0, p, "twin", {}, backward=b).queue_weight for p in (plain, many, big) for b in (0, 1)}
    assert 1.0 <= w[(plain, 0)] < 1.05 and w[(plain, 1)] == 2 * w[(plain, 0)]
    assert w[(many, 1)] > 4 * w[(plain, 1)]
    assert w[(big, 1)] > 4 * w[(plain, 1)]      # the warm audit's last item on the H200


def test_the_default_deadline():
    """Note [Default deadline]: on a GPU max(floor, 5 x cost); none on the CPU; --timeout wins."""
    assert task_deadline(None, "cuda", 10) == MIN_DEADLINE_S
    assert task_deadline(None, "cuda", 240) == 1200
    assert task_deadline(None, "cpu", 240) == 0.0
    assert task_deadline(7.5, "cuda", 240) == 7.5 and task_deadline(0.0, "cuda", 240) == 0.0


# ------------------------------------------------------------------------------ verdicts
def test_the_verdict_does_not_depend_on_where_the_cases_ran(tmp_path):
    runs = [audit(tmp_path, "-k", "grid", "--opt", "fail=96,160", *extra, name=f"r{n}.json")
            for n, extra in enumerate([("--isolate", "never"), ("--isolate", "always", "--workers", "1"),
                                       ("--isolate", "always", "--workers", "3")])]
    rows = [r["fixture.cases.grid"] for _c, r in runs]
    assert {c for c, _r in runs} == {1}
    assert rows[0]["status"] == "fail" and rows[0]["summary"] == "head dims [96, 160] over budget"
    for r in rows[1:]:
        assert (r["status"], r["summary"], r["metrics"], r["details"]["cases"]) == \
               (rows[0]["status"], rows[0]["summary"], rows[0]["metrics"], rows[0]["details"]["cases"])
        assert r["isolated"] and len(r["timing"]) == 6          # one task per compile key
    pids = rows[2]["details"]["pids"]
    assert all(pids[2 * k] == pids[2 * k + 1] for k in range(6))  # a key's cases: one worker
    assert os.getpid() not in pids and rows[0]["details"]["pids"] == [os.getpid()] * 12


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_crashed_case_is_an_error_of_its_check_only(tmp_path, how):
    code, r = audit(tmp_path, "-k", "crash or grid", "--isolate", "always", "--workers", "2",
                    "--opt", f"crash={how}")
    row = r["fixture.cases.crash"]
    assert code == 3 and row["status"] == "error"
    assert row["summary"].startswith("1/3 case(s) did not finish: case 2/3 (sm90 bf16") and "d=96" in row["summary"]
    assert ("SIGKILL" if how == "kill" else "RuntimeError: case 2 broke") in row["summary"]
    assert r["fixture.cases.grid"]["status"] == "pass"


@pytest.mark.parametrize("isolate", ["never", "always"])
@pytest.mark.parametrize("how,status,words", [("skip", "skip", "nothing to plan here"),
                                              ("raise", "error", "cases: ValueError: the plan broke"),
                                              ("none", "pass", "0 cases fine")])
def test_a_check_whose_plan_skips_raises_or_is_empty_is_reported(tmp_path, isolate, how, status, words):
    """``cases(ctx)`` runs in the auditing process: a skip, an exception or no case at all ends the
    check there, with a row in the report (a missing row was an internal error)."""
    code, r = audit(tmp_path, "-k", "plan or grid", "--isolate", isolate, "--opt", f"plan={how}")
    row = r["fixture.cases.plan"]
    assert row["status"] == status and words in row["summary"], row["summary"]
    if how == "raise":      # drawn in a planning thread: the traceback is the plan's own
        assert "_plan_or_not" in row["details"]["traceback"], row["details"]["traceback"]
    assert r["fixture.cases.grid"]["status"] == "pass" and code == (3 if status == "error" else 0)


def test_whole_checks_start_in_the_pool_before_the_cases_of_others_are_planned(tmp_path):
    """A draw or a plan in the auditing process never delays the whole checks' tasks: the late
    check's plan waits for the early check's marker, written in a worker."""
    code, r = audit(tmp_path, "-k", "early or late", "--isolate", "always", "--workers", "2",
                    "--opt", f"early={tmp_path}")
    assert r["fixture.cases.late"]["status"] == "pass", r["fixture.cases.late"]["summary"]
    assert r["fixture.cases.early"]["isolated"] and code == 0


def test_a_slow_plan_does_not_hold_back_the_tasks_of_another_check(tmp_path):
    """Note [Plans in parallel]: the costlier check's plan is drawn first and takes long (it waits
    for a case of the cheaper check to run); the cheaper check is planned meanwhile and its task
    runs in a worker, so both pass. Planned one after another, the slow plan gave up first."""
    code, r = audit(tmp_path, "-k", "slowdraw or quickdraw", "--isolate", "always", "--workers", "2",
                    "--opt", f"marks={tmp_path}")
    assert r["fixture.cases.slowdraw"]["status"] == "pass", r["fixture.cases.slowdraw"]["summary"]
    assert r["fixture.cases.quickdraw"]["status"] == "pass" and code == 0


def test_an_import_error_in_a_planning_thread_is_drawn_again(tmp_path):
    """A plan that met a half-initialised module in a planning thread is drawn once more in the
    auditing thread, alone (Note [Plans in parallel])."""
    code, r = audit(tmp_path, "-k", "importonce", "--isolate", "always", "--workers", "1",
                    "--opt", f"marks={tmp_path}")
    assert r["fixture.cases.importonce"]["status"] == "pass", r["fixture.cases.importonce"]["summary"]
    assert code == 0


def test_a_proven_violation_stands_beside_a_crashed_case(tmp_path):
    code, r = audit(tmp_path, "-k", "crash", "--isolate", "always", "--opt", "crash=kill",
                    "--opt", "crash_fail=1")
    row = r["fixture.cases.crash"]
    assert code == 1 and row["status"] == "fail" and "check incomplete" in row["summary"]


def test_a_hung_case_is_killed_at_its_deadline_naming_the_problem(tmp_path):
    t0 = time.monotonic()
    code, r = audit(tmp_path, "-k", "hang or grid", "--isolate", "always", "--workers", "2",
                    "--timeout", "4")
    row = r["fixture.cases.hang"]
    assert code == 3 and row["status"] == "error"
    assert "did not finish in 4 s" in row["summary"] and "d=96" in row["summary"], row["summary"]
    assert r["fixture.cases.grid"]["status"] == "pass"         # the others keep their verdicts
    assert time.monotonic() - t0 < 120


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_kill_9_of_the_audit_leaves_no_worker(tmp_path, start):
    """Note [Worker isolation]: the worker (and the zygote that forked it) die with the audit.
    The signal is sent once the worker wrote its readiness marker, never after a sleep."""
    marker = tmp_path / "ready"
    env = dict(os.environ, FA4VERIFY_WORKER_START=start)
    proc = subprocess.Popen([sys.executable, "-m", "fa4verify", "audit", "--no-default-checks", "--no-live",
                             "--checks-module", FIX, "-k", "marker", "--isolate", "always",
                             "--opt", f"marker={marker}"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, "the audit ended before its worker was ready"
            assert time.monotonic() < deadline, "no readiness marker"
            time.sleep(0.05)
        pid = int(marker.read_text())
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        family = {pid} | ({ppid} if ppid != proc.pid else set())   # the zygote, when forked
        assert (len(family) == 2) == (start == "fork") and all(_alive(p) for p in family)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in family)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_shadow_package_in_the_cwd_does_not_change_a_verdict(tmp_path, monkeypatch):
    """A ``fa4verify/`` and a ``numpy.py`` in the working directory (and on PYTHONPATH as ".")
    are never imported by a worker: the failing check still fails (exit 1); a worker that
    imported them would have died (exit 3)."""
    shadow = tmp_path / "cwd"
    (shadow / "fa4verify").mkdir(parents=True)
    (shadow / "fa4verify" / "__init__.py").write_text("import os\nos._exit(0)\n")
    (shadow / "numpy.py").write_text("raise ImportError('the shadow numpy')\n")
    monkeypatch.chdir(shadow)
    monkeypatch.setenv("PYTHONPATH", ".")
    code, r = audit(tmp_path, "-k", "verdict", "--isolate", "always")
    assert r["fixture.cases.verdict"]["status"] == "fail" and r["fixture.cases.verdict"]["isolated"]
    assert code == 1


def test_fuzz_twin_gives_one_verdict_in_process_and_over_workers(tmp_path):
    """The real drawn campaign: one draw in the auditing process, the examples run by two
    workers, the summary over every example equals the in-process one."""
    base = ["-k", "fuzz.twin", "--arch", "sm90", "--seed", "4", "--opt", "fuzz_examples=6"]
    got = []
    for n, extra in enumerate([("--isolate", "never"), ("--isolate", "always", "--workers", "2")]):
        j = tmp_path / f"f{n}.json"
        code = main(["audit", "--no-live", "--json", str(j), *base, *extra])
        got.append((code, {r["id"]: r for r in json.loads(j.read_text())["results"]}["fuzz.twin[sm90]"]))
    (c0, a), (c1, b) = got
    assert c0 == c1 and not a["isolated"] and b["isolated"]
    assert (a["status"], a["summary"], a["details"]["draw_digest"], a["details"]["coverage"]) == \
           (b["status"], b["summary"], b["details"]["draw_digest"], b["details"]["coverage"])
    assert a["details"]["examples_drawn"] == 6
