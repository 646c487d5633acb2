"""Shardable audit checks (fa4verify.audit.shards, ``@check(shards=, merge=)``): the runner
expands a check into work items ``<id>[i/k]``, the pool runs them side by side, and the merge
gives ONE result per check whose verdict is the unsharded one; a missing or errored shard is
never a pass. CPU only: fixture checks (isolated with ``--isolate always``), the real fuzz.twin
check, drawn fuzz campaigns, and budgets.production.backward with a CPU stand-in adapter."""
from __future__ import annotations

import json
import os

import pytest

from fa4verify.audit import registry
from fa4verify.audit.execute import execute
from fa4verify.audit.registry import CheckContext, CheckResult
from fa4verify.audit.shards import generic_merge, merge_shards, merged_check_status, shard_count
from fa4verify.cli import main
from fa4verify.sharding import assign_groups

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
SHARDS = os.path.join(FIX, "audit_checks_shards.py")


def audit(tmp_path, *args: str, name: str = "a.json") -> tuple[int, dict]:
    j = tmp_path / name
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", SHARDS,
                 "--isolate", "always", "--json", str(j), *args])
    with open(j) as f:
        rep = json.load(f)
    return code, rep


def by_id(rep: dict) -> dict:
    return {r["id"]: r for r in rep["results"]}


# ------------------------------------------------------------------------------ assignment
def test_assign_groups_is_a_partition_that_keeps_each_key_on_one_shard():
    items = [(j * 7) % 5 for j in range(23)]          # keys 0..4, unevenly repeated
    for k in (1, 2, 3, 4, 8):
        parts = assign_groups(items, k, key=lambda x: x, key_cost=3.0)
        assert len(parts) == k
        flat = sorted(j for p in parts for j in p)
        assert flat == list(range(len(items)))         # every item exactly once
        owner = {}
        for s, p in enumerate(parts):
            for j in p:
                assert owner.setdefault(items[j], s) == s   # a key never spans two shards
        assert parts == assign_groups(items, k, key=lambda x: x, key_cost=3.0)  # deterministic


def test_assign_groups_balances_items_without_keys():
    parts = assign_groups(list(range(10)), 3)
    assert sorted(len(p) for p in parts) == [3, 3, 4]
    with pytest.raises(ValueError):
        assign_groups([1], 0)


def test_shard_items_of_all_shards_cover_the_cases_once():
    cases = list(range(17))
    got = [CheckContext(shard=(i, 4)).shard_items(cases, key=lambda c: c % 6) for i in range(4)]
    assert sorted(c for g in got for c in g) == cases
    assert CheckContext().shard_items(cases) == cases


# ------------------------------------------------------------------------------ merge rule
def _r(status: str, **kw) -> CheckResult:
    return CheckResult(status=status, where="CPU", summary=kw.pop("summary", status), **kw)


def test_merged_status_is_fail_over_error_over_undecided_over_pass():
    assert merged_check_status(["pass", "pass"]) == "pass"
    assert merged_check_status(["pass", "undecided"]) == "undecided"
    assert merged_check_status(["undecided", "error", "pass"]) == "error"
    assert merged_check_status(["error", "fail"]) == "fail"
    assert merged_check_status(["skip", "pass"]) == "pass"
    assert merged_check_status(["skip", "skip"]) == "skip"
    assert merged_check_status([]) == "error"


def _spec(**kw):
    return registry.CheckSpec(id="x.y", title="t", needs=frozenset({"cpu"}), profiles=frozenset({"default"}),
                              func=lambda ctx: _r("pass"), module="m", shards=2, **kw)


def test_a_missing_shard_is_an_error_never_a_pass():
    ctx = CheckContext(check_id="x.y")
    out = merge_shards(_spec(), ctx, [_r("pass"), None], [1.0, None])
    assert out.status == "error" and "shard 2/2 missing" in out.summary
    assert [s["status"] for s in out.details["shards"]] == ["pass", "missing"]


def test_an_errored_shard_is_an_error_but_a_failing_shard_still_fails():
    ctx = CheckContext(check_id="x.y")
    out = merge_shards(_spec(), ctx, [_r("pass"), _r("error", summary="boom")], [1.0, 2.0])
    assert out.status == "error" and "boom" in out.summary
    out = merge_shards(_spec(), ctx, [_r("fail", summary="over budget"), _r("error")], [1.0, 2.0])
    assert out.status == "fail" and "incomplete" in out.summary


def test_a_broken_merge_function_is_an_error():
    def bad(ctx, parts):
        raise KeyError("shard_payload")
    out = merge_shards(_spec(merge=bad), CheckContext(check_id="x.y"), [_r("pass"), _r("pass")], [1, 1])
    assert out.status == "error" and "merging 2 shards failed" in out.summary


def test_generic_merge_sums_counts_and_takes_the_largest_tightness():
    a = _r("pass", metrics={"examples": 3, "tightness_max": 0.5}, tightness=0.5)
    b = _r("pass", metrics={"examples": 4, "tightness_max": 0.75}, tightness=0.75)
    out = generic_merge(CheckContext(), [a, b])
    assert out.status == "pass" and out.metrics == {"examples": 7, "tightness_max": 0.75}
    assert out.tightness == 0.75
    und = generic_merge(CheckContext(), [a, _r("undecided")])
    assert und.status == "undecided"
    # a shard that skipped (not for want of cases) beside shards that ran: not a pass
    assert generic_merge(CheckContext(), [a, _r("skip", summary="no GPU")]).status == "undecided"
    empty = _r("skip", details={"shard_empty": True})
    assert generic_merge(CheckContext(), [a, empty]).status == "pass"


def test_shard_count_override_and_unshardable_checks():
    spec = _spec()
    assert shard_count(spec, "default", 4, None) == 2
    assert shard_count(spec, "default", 4, 1) == 1        # --no-shard
    assert shard_count(spec, "default", 4, 5) == 5        # --shards 5
    one = registry.CheckSpec(id="a.b", title="t", needs=frozenset({"cpu"}), profiles=frozenset({"default"}),
                             func=lambda ctx: _r("pass"), module="m")
    assert shard_count(one, "default", 4, 5) == 1
    with pytest.raises(ValueError):
        registry.check("bad.shards", shards=0)


# ------------------------------------------------------------------------------ the runner
def test_a_sharded_check_is_one_report_row_with_its_shards_listed(tmp_path):
    code, rep = audit(tmp_path, "-k", "fixture.shard.cases", "--workers", "2")
    r = by_id(rep)
    assert code == 0 and list(r) == ["fixture.shard.cases"]
    row = r["fixture.shard.cases"]
    assert [s["shard"] for s in row["details"]["shards"]] == [f"fixture.shard.cases[{i}/3]" for i in (1, 2, 3)]
    assert row["metrics"]["cases"] == 12 and row["details"]["shard_max_s"] > 0
    assert "shard_payload" not in row["details"]
    pids = {x["pid"] for x in row["details"]["rows"]}
    assert len(pids) == 2                                    # two workers shared the three shards


@pytest.mark.parametrize("fail", ["", "3,10"])
def test_sharded_verdict_equals_the_unsharded_one(tmp_path, fail):
    args = ["-k", "fixture.shard.cases", "--workers", "2"] + (["--opt", f"fail={fail}"] if fail else [])
    c1, a = audit(tmp_path, *args, name="sharded.json")
    c0, b = audit(tmp_path, *args, "--no-shard", name="unsharded.json")
    ra, rb = by_id(a)["fixture.shard.cases"], by_id(b)["fixture.shard.cases"]
    assert "shards" not in rb["details"]                      # --no-shard: the old single item
    assert c1 == c0 == (1 if fail else 0)
    assert (ra["status"], ra["summary"], ra["tightness"]) == (rb["status"], rb["summary"], rb["tightness"])
    assert ra["metrics"] == rb["metrics"]
    strip = lambda rows: [{k: v for k, v in x.items() if k != "pid"} for x in rows]  # noqa: E731
    assert strip(ra["details"]["rows"]) == strip(rb["details"]["rows"])


def test_shards_option_forces_the_count_and_generic_merge_applies(tmp_path):
    code, rep = audit(tmp_path, "-k", "fixture.shard.generic", "--workers", "2", "--shards", "4")
    row = by_id(rep)["fixture.shard.generic"]
    assert code == 0 and len(row["details"]["shards"]) == 4
    assert row["metrics"]["examples_higher_is_better"] == 10 and row["tightness"] == 0.9
    code, rep = audit(tmp_path, "-k", "fixture.shard.generic", "--workers", "2", "--opt", "generic=undecided")
    row = by_id(rep)["fixture.shard.generic"]
    assert len(row["details"]["shards"]) == 3              # shards = workers + 1
    assert code == 10 and row["status"] == "undecided"


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_crashed_shard_makes_the_check_an_error_not_a_pass(tmp_path, how):
    code, rep = audit(tmp_path, "-k", "fixture.shard.crash", "--workers", "2", "--opt", f"crash={how}")
    row = by_id(rep)["fixture.shard.crash"]
    assert row["status"] == "error" and code == 3, row["summary"]
    assert "shard 2/2 errored" in row["summary"]
    assert [s["status"] for s in row["details"]["shards"]] == ["pass", "error"]


def test_shards_of_one_check_run_side_by_side(tmp_path):
    meet = tmp_path / "meet"
    meet.mkdir()
    code, rep = audit(tmp_path, "-k", "fixture.shard.meet", "--workers", "2", "--opt", f"meet={meet}")
    assert by_id(rep)["fixture.shard.meet"]["status"] == "pass" and code == 0


def test_in_process_shards_merge_too(tmp_path):
    j = tmp_path / "in.json"
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", SHARDS, "-k",
                 "fixture.shard.cases", "--opt", "fail=5", "--json", str(j)])
    row = by_id(json.loads(j.read_text()))["fixture.shard.cases"]
    assert code == 1 and row["summary"] == "cases [5] over budget" and not row["isolated"]
    assert len(row["details"]["shards"]) == 3


@pytest.mark.parametrize("args,msg", [(["--shards", "0"], "--shards"), (["--shards", "x"], "--shards"),
                                      (["--shards", "3", "--no-shard"], "--no-shard")])
def test_bad_shard_options_are_one_line_usage_errors(capsys, args, msg):
    code = main(["audit", "--no-default-checks", "--no-live", "--checks-module", SHARDS, *args])
    err = capsys.readouterr().err
    assert code == 2 and msg in err and "Traceback" not in err


# ------------------------------------------------------------------------------ fuzz shards
def test_fuzz_shards_draw_disjoint_examples_whose_union_is_the_unsharded_campaign():
    from fa4verify.fuzz import compile_key, draw_problems
    kw = dict(arch="sm90", dtype="bf16", examples=24, seed=5, profile="ci")
    problems = draw_problems(**kw)
    again = draw_problems(**kw)
    assert [p.digest() for p in problems] == [p.digest() for p in again]     # deterministic
    assert len({p.digest() for p in problems}) == len(problems) and 18 <= len(problems) <= 24
    assert [p.digest() for p in draw_problems(**dict(kw, seed=6))] != [p.digest() for p in problems]
    for k in (2, 3, 5):
        shares = [CheckContext(shard=(i, k)).shard_items(range(len(problems)),
                                                         key=lambda j: compile_key(problems[j]))
                  for i in range(k)]
        union = sorted(j for s in shares for j in s)
        assert union == list(range(len(problems)))                           # disjoint, complete
        keys = [{compile_key(problems[j]) for j in s} for s in shares]
        for a in range(k):
            for b in range(a + 1, k):
                assert not keys[a] & keys[b]                                 # no shared compile key


def test_a_drawn_campaign_merged_from_shards_equals_the_unsharded_one_and_refuses_gaps():
    from fa4verify import fuzz
    problems = fuzz.draw_problems(arch="sm90", dtype="bf16", examples=8, seed=2, profile="ci")
    tgt = fuzz.TwinTarget(["causal_off_by_one"])
    whole = fuzz.run_drawn(problems, range(8), target=tgt)
    halves = [fuzz.run_drawn(problems, idx, target=tgt) for idx in ([0, 2, 4, 6], [1, 3, 5, 7])]
    a = fuzz.merge_drawn([whole], expected=8, arch="sm90", profile="ci", seed=2)
    b = fuzz.merge_drawn(halves, expected=8, arch="sm90", profile="ci", seed=2)
    for name in ("examples_run", "coverage", "properties_ran", "known_hits", "undecided", "max_metrics"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.failure or {}).get("example_index") == (b.failure or {}).get("example_index")
    assert a.found == b.found
    with pytest.raises(ValueError, match="incomplete"):
        fuzz.merge_drawn(halves[:1], expected=8, arch="sm90", profile="ci", seed=2)
    with pytest.raises(ValueError, match="two workers"):
        fuzz.merge_drawn([whole, halves[0]], expected=8, arch="sm90", profile="ci", seed=2)


@pytest.mark.slow
def test_the_real_fuzz_twin_check_gives_the_same_verdict_sharded():
    import fa4verify.checks.fuzz  # noqa: F401 - registers the check
    spec = registry.registered()["fuzz.twin"]

    def ctx(sh=(0, 1)):
        return CheckContext(dtype="bf16", arch="sm90", profile="default", seed=3,
                            check_id="fuzz.twin[sm90]", shard=sh)
    whole = execute(spec, ctx())
    parts = [execute(spec, ctx((i, 3))) for i in range(3)]
    merged = merge_shards(spec, ctx(), parts, [1.0, 1.0, 1.0])
    assert whole.status in ("pass", "fail", "undecided")
    assert (merged.status, merged.summary) == (whole.status, whole.summary)
    drop = {"seconds"}
    assert {k: v for k, v in merged.metrics.items() if k not in drop} == \
           {k: v for k, v in whole.metrics.items() if k not in drop}
    assert merged.details["coverage"] == whole.details["coverage"]
    assert sum(1 for p in parts if p.status != "skip" or not p.details.get("shard_empty")) >= 2


@pytest.mark.slow
def test_fuzz_twin_shards_in_separate_workers_draw_the_same_campaign(tmp_path):
    """Across processes: two workers each draw the campaign and run their share; the merged row
    equals the unsharded in-process check (and a different draw would be refused)."""
    j1, j0 = tmp_path / "s.json", tmp_path / "u.json"
    base = ["audit", "--no-live", "-k", "fuzz.twin", "--arch", "sm90", "--seed", "4"]
    c1 = main(base + ["--isolate", "always", "--workers", "2", "--shards", "2", "--json", str(j1)])
    c0 = main(base + ["--json", str(j0)])
    a, b = by_id(json.loads(j1.read_text()))["fuzz.twin[sm90]"], by_id(json.loads(j0.read_text()))["fuzz.twin[sm90]"]
    assert c1 == c0 and a["isolated"] and not b["isolated"] and len(a["details"]["shards"]) == 2
    assert (a["status"], a["summary"], a["details"]["draw_digest"]) == (b["status"], b["summary"], b["details"]["draw_digest"])
    assert a["details"]["coverage"] == b["details"]["coverage"]
    parts = [CheckResult(status="pass", details={"shard_payload": {"draw_digest": d}}) for d in ("x", "y")]
    from fa4verify.checks import fuzz as F
    with pytest.raises(ValueError, match="different example lists"):
        F._merge_campaign(CheckContext(), parts)


# ------------------------------------------------------------------------------ live checks on a CPU stand-in
@pytest.mark.slow
def test_production_backward_sharded_equals_unsharded_with_a_cpu_stand_in(monkeypatch):
    pytest.importorskip("torch")
    import test_production_budget_checks as tpb
    from fa4verify.checks import budgets as B
    tpb._stand_in(monkeypatch, dq_scale=1.05)                # a 5 % dQ fault: the check fails
    spec = registry.registered()["budgets.production.backward"]

    def ctx(sh=(0, 1)):
        return CheckContext(profile="default", check_id="budgets.production.backward", dtype="bf16", shard=sh)
    whole = execute(spec, ctx())
    parts = [execute(spec, ctx((i, 2))) for i in range(2)]
    merged = merge_shards(spec, ctx(), parts, [1.0, 1.0])
    assert whole.status == "fail"
    assert (merged.status, merged.summary, merged.tightness) == (whole.status, whole.summary, whole.tightness)
    assert merged.details["table"] == whole.details["table"]
    assert B._case_shards("default", 8) == 4


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0.0, 0.01])
def test_production_forward_sharded_equals_unsharded_with_a_cpu_stand_in(monkeypatch, shift):
    pytest.importorskip("torch")
    import test_production_budget_checks as tpb
    tpb._stand_in(monkeypatch, out_shift=shift)             # 0.01 on O: the check fails
    spec = registry.registered()["budgets.production.forward"]

    def ctx(sh=(0, 1)):
        return CheckContext(profile="default", check_id="budgets.production.forward", dtype="bf16", shard=sh)
    whole = execute(spec, ctx())
    parts = [execute(spec, ctx((i, 3))) for i in range(3)]
    merged = merge_shards(spec, ctx(), parts, [1.0, 1.0, 1.0])
    assert whole.status == ("fail" if shift else "pass"), whole.summary
    assert (merged.status, merged.summary, merged.tightness) == (whole.status, whole.summary, whole.tightness)
    assert merged.details["table"] == whole.details["table"]
    assert merged.details["kernel_configs"] == whole.details["kernel_configs"]


@pytest.mark.slow
def test_determinism_fa4_sharded_equals_unsharded_with_a_cpu_backend(monkeypatch):
    pytest.importorskip("torch")
    from fa4verify import determinism as d
    from fa4verify.checks import determinism as D
    spec = registry.registered()["determinism.fa4"]
    plan = (("mha-hd64-full", "gqa-hd64-causal", "mha-hd64-sink", "mha-hd64-kv-tiles"), 2, 1, 1)
    monkeypatch.setitem(D._FA4_PLAN, "default", plan)
    monkeypatch.setattr(D, "_FA4_DEVICE", "cpu")

    def backend(name):
        be = d.TorchMathBackend()
        be.arch = "sm90"
        return be
    monkeypatch.setattr(d, "load_backend", backend)
    monkeypatch.setattr(CheckContext, "where_measured", lambda self: "CPU")

    def ctx(sh=(0, 1)):
        return CheckContext(profile="default", check_id="determinism.fa4", dtype="bf16", shard=sh)
    whole = execute(spec, ctx())
    parts = [execute(spec, ctx((i, 3))) for i in range(3)]
    # mha-hd64-full and mha-hd64-kv-tiles compile one kernel: they share a shard
    assert sorted(len(p.details["shard_payload"].get("configs", [])) for p in parts) == [1, 1, 2]
    merged = merge_shards(spec, ctx(), parts, [1.0, 1.0, 1.0])
    assert whole.status == "pass", whole.summary
    assert (merged.status, merged.summary, merged.metrics) == (whole.status, whole.summary, whole.metrics)
    assert [c["name"] for c in merged.details["report"]["configs"]] == list(plan[0])
    parts[0] = _r("pass", details={"shard_payload": {"records": [], "configs": []}})
    assert merge_shards(spec, ctx(), parts, [1.0, 1.0, 1.0]).status == "error"   # a config missing


def test_head_dims_live_merge_needs_every_head_dim():
    from fa4verify.checks import production as P
    spec = registry.registered()["production.head_dims_live"]
    head = {"hds": [8, 64], "where": "CPU", "version": "x", "arch": "sm90"}
    rows = {8: {"head_dim": 8, "seqlen_q": 256, "seqlen_k": 256, "causal": False,
                "dq_rel_err": 0.9, "dk_rel_err": 0.003, "dv_rel_err": 0.003},
            64: {"head_dim": 64, "seqlen_q": 256, "seqlen_k": 256, "causal": False,
                 "dq_rel_err": 0.003, "dk_rel_err": 0.003, "dv_rel_err": 0.003}}
    parts = [_r("fail", details={"shard_payload": dict(head, rows=[rows[8]])}),
             _r("pass", details={"shard_payload": dict(head, rows=[rows[64]])})]
    merged = merge_shards(spec, CheckContext(check_id=spec.id), parts, [1.0, 1.0])
    whole = P._head_dim_result([rows[8], rows[64]], "CPU", "x", arch="sm90")
    assert (merged.status, merged.summary) == (whole.status, whole.summary) and whole.status == "fail"
    parts[1] = _r("pass", details={"shard_payload": dict(head, rows=[])})
    assert merge_shards(spec, CheckContext(check_id=spec.id), parts, [1.0, 1.0]).status == "error"


def test_forward_rule_merge_needs_both_masks():
    from fa4verify.checks import production as P
    spec = registry.registered()["production.forward_rule"]
    rows = [["noncausal", 0.002, 0.005], ["causal", 0.012, 0.005]]    # causal over the rule: fail
    parts = [_r("pass", details={"shard_payload": {"rows": [rows[0]], "where": "CPU", "config": {"arch": 90}}}),
             _r("fail", details={"shard_payload": {"rows": [rows[1]], "where": "CPU", "config": {"arch": 90}}})]
    merged = merge_shards(spec, CheckContext(check_id=spec.id), parts, [1.0, 1.0])
    whole = P._forward_rule_result(rows, "CPU", {"arch": 90})
    assert whole.status == "fail" and (merged.status, merged.summary, merged.metrics) == \
        (whole.status, whole.summary, whole.metrics)
    parts[1] = _r("skip", details={"shard_empty": True, "shard_payload": {"rows": [], "where": "CPU", "config": {}}})
    assert merge_shards(spec, CheckContext(check_id=spec.id), parts, [1.0, 1.0]).status == "error"


def test_the_gpu_checks_declare_their_shards():
    import fa4verify.checks  # noqa: F401
    from fa4verify.audit.registry import discover
    specs = {s.id: s for s in discover()}
    for cid in ("fuzz.production", "determinism.fa4", "budgets.production.backward",
                "budgets.production.forward", "production.head_dims_live", "production.forward_rule"):
        assert specs[cid].shard_count("default", 8) > 1, cid
        assert specs[cid].merge is not None, cid
        assert specs[cid].shard_count("default", 1) == 1, cid
    assert specs["determinism.fa4"].shard_count("full", 8) == 1     # fresh-process matrix: one item
