"""One check's shards spread over the GPUs of ``fa4verify audit --gpus`` (issue 19): the work units
``(check, shard s of k)`` with k for the whole node, their longest-first assignment, the run of
pre-assigned units (``fa4verify.audit.units.run_units``) and the parent's merge of each check's
parts (``fa4verify.audit.gpus.merge_parts``): every shard exactly once, a dead GPU's unfinished
checks ``error`` naming it. CPU only; the end-to-end tests spawn fake GPUs
(``FA4VERIFY_FAKE_GPUS=N``) and compare with the one-GPU audit."""
from __future__ import annotations

import json
import os
import types

import pytest

from fa4verify import multigpu as mg
from fa4verify._options import build_config
from fa4verify.audit.gpus import assign_units, merge_parts, plan_units
from fa4verify.audit.registry import CheckResult, CheckSpec
from fa4verify.audit.runner import Selected, load_specs, select
from fa4verify.audit.shards import merge_shards
from fa4verify.audit.units import UnitPart, WorkUnit, run_units
from fa4verify.multigpu import Gpu

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
GPU_SHARDS = os.path.join(FIX, "audit_checks_gpu_shards.py")
SHARDS = os.path.join(FIX, "audit_checks_shards.py")
G = [Gpu(i, str(i), f"Fake GPU {i}", f"GPU-fake-{i:08d}", True) for i in range(3)]


def _config(*, isolate="never", workers=2, shards=None, modules=(GPU_SHARDS,), keyword=None, opts=()):
    return build_config(dtype="bf16", device="cpu", arch="auto", profile="quick", seed=0,
                        keyword=keyword, shard=None, checks_modules=list(modules),
                        no_default_checks=True, isolate=isolate, timeout=0, opts=list(opts),
                        deployment=None, workers=workers, fresh_workers=False, kernel_cache=None,
                        check_shards=shards, no_shard=False)


def _selected(config):
    return select(load_specs(config), config)


# ------------------------------------------------------------------------------ plan and assignment
def test_a_sharded_checks_shard_count_is_for_every_worker_of_the_node():
    cfg = _config(isolate="always", workers=2)
    units = plan_units(_selected(cfg), cfg, 3)
    by = {}
    for u in units:
        by.setdefault(u.id, []).append(u)
    assert [u.shard for u in by["fixture.gpushard.where"]] == list(range(6))      # 2 workers x 3 GPUs
    assert {u.count for u in by["fixture.gpushard.where"]} == {6}
    assert [u.shard for u in by["fixture.gpushard.fixed"]] == [0, 1, 2, 3]        # shards=4 fixed
    assert by["fixture.gpushard.fixed"][0].cost == pytest.approx(8 / 4)          # cost split
    # in-process checks count one worker per GPU; --shards overrides as in run_audit
    never = _config(isolate="never", workers=2)
    assert len([u for u in plan_units(_selected(never), never, 3) if u.id == "fixture.gpushard.where"]) == 3
    forced = _config(isolate="always", workers=2, shards=5)
    assert {u.count for u in plan_units(_selected(forced), forced, 3)} == {5}


def test_units_go_longest_first_onto_the_least_loaded_gpu_each_exactly_once():
    units = [WorkUnit("a", s, 4, 2.0) for s in range(4)] + [WorkUnit("b", 0, 1, 5.0),
                                                            WorkUnit("c", 0, 1, 1.0)]
    parts = assign_units(units, 3)
    assert sorted(j for p in parts for j in p) == list(range(6))                # every unit once
    # b (5) -> GPU 0; a's four shards (2 each) -> GPU 1, GPU 2, GPU 1, GPU 2 (loads 5, 4, 4);
    # c (1) -> GPU 1 (the least loaded, tie with GPU 2: the lower index)
    assert parts == [[4], [0, 2, 5], [1, 3]]
    assert assign_units(units, 3) == parts                                       # deterministic
    # one check's shards land on several GPUs
    assert len({g for g, p in enumerate(parts) for j in p if units[j].id == "a"}) == 2
    with pytest.raises(ValueError):
        assign_units(units, 0)


# ------------------------------------------------------------------------------ run_units
def test_run_units_runs_exactly_the_given_shards_and_returns_raw_parts(tmp_path):
    cfg = _config()
    sel = {s.id: s for s in _selected(cfg)}["fixture.gpushard.where"]
    seen = []
    parts = run_units(cfg, [(sel, WorkUnit(sel.id, 2, 3, 2.0)), (sel, WorkUnit(sel.id, 0, 3, 2.0))],
                      sink=seen.append, tag={"gpu": 7})
    assert [p.unit.shard for p in parts] == [2, 0] and len(seen) == 2
    assert [sorted(r["case"] for r in p.result.details["shard_payload"]) for p in parts] == \
        [[2, 5, 8], [0, 3, 6]]                        # shard s of 3 takes cases s, s+3, s+6
    assert all(p.timing["gpu"] == 7 and p.timing["shard"] == p.unit.shard for p in parts)
    assert all(p.timing["end_s"] >= p.timing["start_s"] >= 0 for p in parts)
    back = UnitPart.from_dict(json.loads(json.dumps(parts[0].to_dict())))   # what the file carries
    assert back.unit == parts[0].unit and back.result.details == parts[0].result.details


def test_run_units_skips_a_unit_whose_needs_are_unmet_without_running_it():
    cfg = _config()
    spec = CheckSpec(id="x.cuda", title="t", needs=frozenset({"cuda"}), profiles=frozenset({"quick"}),
                     func=lambda ctx: (_ for _ in ()).throw(AssertionError("ran")), module="m")
    sel = Selected(spec, "x.cuda", "sm90")
    [p] = run_units(cfg, [(sel, WorkUnit("x.cuda"))])
    assert p.skipped and p.result.status == "skip"


# ------------------------------------------------------------------------------ the parent's merge
def _spec(merge=None):
    return CheckSpec(id="x.y", title="t", needs=frozenset({"cpu"}), profiles=frozenset({"quick"}),
                     func=lambda ctx: None, module="m", shards=3, merge=merge)


def _part(s, k, status="pass", gpu=0, **metrics):
    return UnitPart(unit=WorkUnit("x.y", s, k), result=CheckResult(status=status, where="CPU",
                    summary=f"shard {s} {status}", metrics=metrics), notes=[f"n{s}"], seconds=1.0 + s,
                    timing={"start_s": float(s), "end_s": float(s) + 1, "shard": s, "gpu": gpu})


def _merge(got, owners=(0, 1, 2), dead=None, k=3):
    cfg = _config()
    sel = Selected(_spec(), "x.y", "sm90")
    units = [WorkUnit("x.y", s, k) for s in range(k)]
    return merge_parts(cfg, sel, units, [G[o] for o in owners], got, dead or {})


def test_all_parts_once_merge_as_merge_shards_does_with_one_timing_entry_per_unit():
    got = [[(G[s], _part(s, 3, gpu=s, examples=s + 1))] for s in range(3)]
    rec = _merge(got)
    want = merge_shards(_spec(), types.SimpleNamespace(check_id="x.y"),
                        [g[0][1].result for g in got], [g[0][1].seconds for g in got])
    assert (rec.status, rec.result.metrics) == ("pass", {"examples": 6}) == (want.status, want.metrics)
    assert [t["gpu"] for t in rec.timing] == [0, 1, 2]
    assert [n for n in rec.notes if n.startswith("ran on")] == [
        f"ran on {G[s].label()}: shard {s + 1} of 3" for s in range(3)]
    assert rec.notes[:3] == ["n0", "n1", "n2"]


def test_a_part_reported_twice_or_by_another_gpu_is_the_checks_error():
    twice = [[(G[0], _part(0, 3))], [(G[1], _part(1, 3)), (G[1], _part(1, 3))], [(G[2], _part(2, 3))]]
    rec = _merge(twice)
    assert rec.status == "error" and "shard 2/3 arrived 2 time(s)" in rec.result.summary
    stray = [[(G[0], _part(0, 3))], [(G[2], _part(1, 3))], [(G[2], _part(2, 3))]]
    rec = _merge(stray)
    assert rec.status == "error" and "assigned once, to GPU 1" in rec.result.summary
    wrong_k = [[(G[0], _part(0, 3))], [(G[1], _part(1, 4))], [(G[2], _part(2, 3))]]
    assert _merge(wrong_k).status == "error"
    # a doubled part never lets a fail elsewhere through as a verdict: error
    dbl_fail = [[(G[0], _part(0, 3, "fail"))], [(G[1], _part(1, 3)), (G[2], _part(1, 3))],
                [(G[2], _part(2, 3))]]
    assert _merge(dbl_fail).status == "error"


def test_a_missing_part_is_an_error_naming_the_gpu_and_why_it_died():
    gone = [[(G[0], _part(0, 3))], [], [(G[2], _part(2, 3))]]
    rec = _merge(gone, dead={1: "killed by SIGABRT (exit -6)"})
    assert rec.status == "error"
    assert rec.result.summary.startswith("GPU 1 (Fake GPU 1, GPU-fake-00000001) process died before "
                                         "this check finished: killed by SIGABRT (exit -6)")
    assert [s["status"] for s in rec.result.details["shards"]] == ["pass", "missing", "pass"]
    rec = _merge(gone)                                           # the process ended well, yet no part
    assert rec.status == "error" and "GPU 1" in rec.result.summary and "without a result" in rec.result.summary


def test_a_fail_among_the_parts_that_arrived_still_fails_the_incomplete_check():
    got = [[(G[0], _part(0, 3, "fail"))], [], [(G[2], _part(2, 3))]]
    rec = _merge(got, dead={1: "killed by SIGKILL (exit -9)"})
    assert rec.status == "fail" and "check incomplete" in rec.result.summary and "GPU 1" in rec.result.summary


def test_a_whole_check_skipped_on_its_gpu_is_a_plain_skip():
    cfg = _config()
    sel = Selected(_spec(), "x.y", "sm90")
    skip = UnitPart(unit=WorkUnit("x.y", 0, 1), result=CheckResult(status="skip", summary="no CUDA"),
                    notes=[], seconds=0.0, timing={"start_s": 0.0, "end_s": 0.0, "gpu": 2}, skipped=True)
    rec = merge_parts(cfg, sel, [WorkUnit("x.y", 0, 1)], [G[2]], [[(G[2], skip)]], {})
    assert rec.status == "skip" and rec.result.summary == "no CUDA" and not rec.isolated


# ------------------------------------------------------------------------------ spawned fake GPUs
AUDIT = ["--no-default-checks", "--profile", "quick", "--device", "cpu", "--no-live",
         "--checks-module", os.path.join(FIX, "audit_checks_ok.py"),
         "--checks-module", os.path.join(FIX, "audit_checks_undecided.py"),
         "--checks-module", SHARDS, "--checks-module", GPU_SHARDS,
         "--opt", f"budget={os.path.join(FIX, 'budget_tight.toml')}", "--opt", "where_fail=4",
         "-k", "not fixture.shard.crash and not fixture.shard.meet"]


def _audit(args, monkeypatch, **env):
    from click.testing import CliRunner

    from fa4verify.cli.audit import command
    for k in (mg.ENV_FAKE, mg.ENV_FAKE_FAULT, mg.ENV_FAKE_CRASH, mg.ENV_FAKE_CRASH_AFTER,
              "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return CliRunner().invoke(command, args)


def _gpus_of(rec) -> set[int]:
    """The GPU indices a record's notes say it ran on."""
    return {int(n[len("ran on GPU "):].split(" ")[0]) for n in rec["notes"] if n.startswith("ran on GPU ")}


def _one_gpu(tmp_path, monkeypatch, isolate="never"):
    one = tmp_path / "one.json"
    r = _audit(AUDIT + ["--isolate", isolate, "--json", str(one)], monkeypatch)
    return r, json.loads(one.read_text())


def test_a_malformed_crash_after_knob_is_a_one_line_usage_error(monkeypatch):
    r = _audit(AUDIT + ["--gpus", "all"], monkeypatch, FA4VERIFY_FAKE_GPUS="2",
               FA4VERIFY_FAKE_GPU_CRASH_AFTER="x")
    assert r.exit_code == 2 and "FA4VERIFY_FAKE_GPU_CRASH_AFTER='x'" in r.output
    assert "Traceback" not in r.output
    assert mg.fake_crash_after({}) == 1 and mg.fake_crash_after({mg.ENV_FAKE_CRASH_AFTER: "0"}) == 0


@pytest.mark.slow   # three spawned processes
def test_three_fake_gpus_give_the_one_gpu_verdicts_and_merged_metrics(tmp_path, monkeypatch):
    r1, a = _one_gpu(tmp_path, monkeypatch)
    three = tmp_path / "three.json"
    r3 = _audit(AUDIT + ["--isolate", "never", "--json", str(three), "--gpus", "all"], monkeypatch,
                FA4VERIFY_FAKE_GPUS="3")
    b = json.loads(three.read_text())
    assert r1.exit_code == r3.exit_code == 1, (r1.output, r3.output)     # the planted fails
    n_units = sum(max(1, len(x["timing"])) for x in b["results"])
    assert f"{len(b['results'])} check(s) as {n_units} work unit(s) over 3 GPU process(es)" in r3.output
    assert [(x["id"], x["status"]) for x in a["results"]] == [(x["id"], x["status"]) for x in b["results"]]
    assert {x["status"] for x in a["results"]} >= {"pass", "fail", "undecided", "skip"}
    assert a["summary"]["counts"] == b["summary"]["counts"]
    for x, y in zip(a["results"], b["results"]):
        assert (x["metrics"], x["tightness"]) == (y["metrics"], y["tightness"]), x["id"]
    ra, rb = ({x["id"]: x for x in rep["results"]} for rep in (a, b))
    where = rb["fixture.gpushard.where"]
    assert where["status"] == "fail" and where["summary"] == ra["fixture.gpushard.where"]["summary"] \
        == "cases [4] over budget"
    # the sharded checks' shards ran in different GPU processes: the GPU index and pid of each
    # case, the timing entries (one per unit, each with its GPU) and the notes agree
    for cid, k in (("fixture.gpushard.where", 3), ("fixture.gpushard.fixed", 4), ("fixture.shard.cases", 3)):
        rec = rb[cid]
        assert sorted(t["shard"] for t in rec["timing"]) == list(range(k))
        assert len({t["gpu"] for t in rec["timing"]}) >= 2, rec["timing"]
        assert {t["gpu"] for t in rec["timing"]} == _gpus_of(rec)
    rows = where["details"]["rows"]
    assert {r["gpu"] for r in rows} == {"0", "1", "2"}                     # 3 shards over 3 GPUs
    assert len({r["pid"] for r in rows}) == 3
    by_gpu = {t["shard"]: t["gpu"] for t in where["timing"]}
    assert all(str(by_gpu[r["case"] % 3]) == r["gpu"] for r in rows)        # shard s: cases s, s+3, ...
    assert len(ra["fixture.gpushard.where"]["details"].get("shards", [])) == 0   # one GPU: unsharded
    assert [e["gpu"]["index"] for e in b["environments"]] == [0, 1, 2]


@pytest.mark.slow   # two spawned processes, each with a worker pool
def test_isolated_shards_run_over_each_gpu_processes_worker_pool(tmp_path, monkeypatch):
    rep = tmp_path / "iso.json"
    r = _audit(AUDIT[:-2] + ["-k", "fixture.gpushard", "--isolate", "always", "--workers", "1",
                             "--json", str(rep), "--gpus", "all"], monkeypatch, FA4VERIFY_FAKE_GPUS="2")
    assert r.exit_code == 1, r.output
    res = {x["id"]: x for x in json.loads(rep.read_text())["results"]}
    where = res["fixture.gpushard.where"]                                  # 1 worker x 2 GPUs: 2 shards
    assert where["isolated"] and where["summary"] == "cases [4] over budget"
    assert sorted((t["shard"], t["gpu"]) for t in where["timing"]) in ([(0, 0), (1, 1)], [(0, 1), (1, 0)])
    assert all("exec_s" in t for t in where["timing"])                     # the worker's own figures
    assert len({r["pid"] for r in where["details"]["rows"]}) == 2          # two worker processes
    assert res["fixture.gpushard.fixed"]["status"] == "pass"


@pytest.mark.slow
def test_a_crashed_gpu_makes_exactly_the_checks_with_a_unit_on_it_errors(tmp_path, monkeypatch):
    _, a = _one_gpu(tmp_path, monkeypatch)
    rep = tmp_path / "crash.json"
    r = _audit(AUDIT + ["--isolate", "never", "--json", str(rep), "--gpus", "3"], monkeypatch,
               FA4VERIFY_FAKE_GPUS="3", FA4VERIFY_FAKE_GPU_CRASH="1", FA4VERIFY_FAKE_GPU_CRASH_AFTER="0")
    b = json.loads(rep.read_text())
    one = {x["id"]: x["status"] for x in a["results"]}
    on_1 = {x["id"] for x in b["results"] if 1 in _gpus_of(x)}
    errors = {x["id"] for x in b["results"] if x["status"] == "error"}
    # the fixtures' shards report raw cases (the verdict comes from the merge), so no shard proves
    # a fail on its own: every check with a unit on GPU 1 is an error, and only those
    assert on_1 and errors == on_1
    assert any(len(_gpus_of(x)) > 1 for x in b["results"] if x["id"] in errors)   # a spread check too
    for x in b["results"]:
        if x["id"] in errors:
            assert "GPU 1 (Fake GPU 1, GPU-fake-00000001) process died" in x["summary"]
            assert "SIGABRT" in x["summary"]
        else:
            assert x["status"] == one[x["id"]], x["id"]               # the others keep their verdicts
    others = [one[i] for i in one if i not in on_1]
    assert r.exit_code == b["summary"]["exit_code"] == (1 if "fail" in others else 3)


@pytest.mark.slow
def test_parts_a_dying_gpu_finished_before_it_died_are_kept(tmp_path, monkeypatch):
    rep = tmp_path / "after.json"
    r = _audit(AUDIT[:-2] + ["-k", "fixture.gpushard", "--isolate", "never", "--json", str(rep),
                             "--gpus", "2"], monkeypatch, FA4VERIFY_FAKE_GPUS="2",
               FA4VERIFY_FAKE_GPU_CRASH="1", FA4VERIFY_FAKE_GPU_CRASH_AFTER="1")
    res = {x["id"]: x for x in json.loads(rep.read_text())["results"]}
    # 2 GPUs, in-process: where = 2 units of cost 3, fixed = 4 units of cost 2. Longest first onto
    # the least-loaded GPU: where 1/2 -> GPU 0, where 2/2 -> GPU 1, fixed 1..4 -> GPU 0, 1, 0, 1.
    # GPU 1 runs where 2/2 first (the longest), finishes it, and dies before fixed 2/4 and 4/4.
    where, fixed = res["fixture.gpushard.where"], res["fixture.gpushard.fixed"]
    assert sorted((t["shard"], t["gpu"]) for t in where["timing"]) == [(0, 0), (1, 1)]
    assert where["status"] == "fail" and where["summary"] == "cases [4] over budget"   # its verdict
    assert fixed["status"] == "error" and "GPU 1 (Fake GPU 1, GPU-fake-00000001) process died" \
        in fixed["summary"] and "shard 2/4 never arrived" in fixed["summary"]
    assert [s["status"] for s in fixed["details"]["shards"]] == ["pass", "missing", "pass", "missing"]
    assert r.exit_code == 1


@pytest.mark.parametrize("workers, want", [(None, 3), ("5", 5)])
def test_auto_workers_under_gpus_share_the_nodes_cores(monkeypatch, workers, want):
    """--workers auto with --gpus: one pool per GPU process, so each gets its share of the cores
    (16 cores, 4 GPUs: auto_workers("cuda", 4) = 3); an explicit count is kept (review, session 7)."""
    import fa4verify.audit.gpus as gpus_mod
    from fa4verify.audit.pool import auto_workers
    seen = {}

    class Stop(Exception):
        pass

    def capture(config, gpu_sel, **kw):
        seen["workers"] = config.workers
        raise Stop
    monkeypatch.setattr(gpus_mod, "run_audit_on_gpus", capture)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    args = AUDIT + ["--gpus", "all"] + (["--workers", workers] if workers else [])
    r = _audit(args, monkeypatch, FA4VERIFY_FAKE_GPUS="4")
    assert isinstance(r.exception, Stop), r.output
    assert seen["workers"] == want and auto_workers("cuda", 4) == 3
