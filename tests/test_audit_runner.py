"""Runner: -k expressions, shard partition, per-arch expansion, exit-code precedence."""
from __future__ import annotations

import pytest

from fa4verify._options import build_config
from fa4verify.audit.registry import PROFILES, CheckResult, CheckSpec
from fa4verify.audit.runner import CheckRecord, compile_keyword, exit_code_for, select
from fa4verify.errors import KeywordError


@pytest.mark.parametrize("expr, text, hit", [
    ("exp2", "exp2.deg3.bf16 title", True),
    ("EXP2", "exp2.deg3.bf16 title", True),
    ("not exp2", "exp2.deg3.bf16 title", False),
    ("exp2 and deg5", "exp2.deg3.bf16 title", False),
    ("exp2 and (deg5 or bf16)", "exp2.deg3.bf16 title", True),
    ("exp2.*.bf16", "exp2.deg3.bf16 title", True),
    ("budget*sm90", "budgets.fwd[sm100] t", False),
    ("[sm100]", "budgets.fwd[sm100] t", True),
])
def test_keyword_expressions(expr, text, hit):
    assert compile_keyword(expr)(text) is hit


@pytest.mark.parametrize("expr", ["(a", "a and", "or a", "a )", "not"])
def test_malformed_keyword_expressions_raise(expr):
    with pytest.raises(KeywordError):
        compile_keyword(expr)


def _spec(id_, archs=None, profiles=PROFILES):
    return CheckSpec(id=id_, title=id_, needs=frozenset({"cpu"}), profiles=frozenset(profiles),
                     func=lambda ctx: CheckResult("pass"), module="m",
                     archs=None if archs is None else frozenset(archs))


def test_shards_are_disjoint_cover_everything_and_are_balanced():
    specs = [_spec(f"c{i:02d}") for i in range(23)] + [_spec("p", archs={"sm90", "sm100"})]
    cfg = build_config(device="cpu")
    full = [s.id for s in select(specs, cfg)]
    for n in (1, 2, 3, 7):
        parts = [[s.id for s in select(specs, build_config(device="cpu", shard=f"{i}/{n}"))]
                 for i in range(1, n + 1)]
        flat = [x for p in parts for x in p]
        assert sorted(flat) == sorted(full) and len(set(flat)) == len(flat)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_per_arch_checks_expand_and_profiles_filter():
    specs = [_spec("a", archs={"sm90", "sm100", "sm103"}), _spec("b", profiles={"full"}), _spec("c")]
    ids = [s.id for s in select(specs, build_config(device="cpu", arch=["sm90", "sm103"]))]
    assert ids == ["a[sm90]", "a[sm103]", "c"]
    only_sm100 = _spec("d", archs={"sm100"})
    sel = select([only_sm100], build_config(device="cpu", arch="sm90"))
    assert [(s.id, s.arch) for s in sel] == [("d[sm100]", "sm100")]  # listed, will skip


def _rec(status):
    return CheckRecord(id=status, check_id=status, title="", module="", arch="", needs=[],
                       result=CheckResult(status, summary="x"))


@pytest.mark.parametrize("statuses, regressions, code", [
    (["pass"], 0, 0), (["pass", "skip"], 0, 0), (["pass"], 1, 1), (["pass", "fail", "error"], 0, 1),
    (["pass", "error"], 0, 3), (["pass", "undecided"], 0, 10), (["error", "undecided"], 0, 3),
    (["skip"], 0, 5), ([], 0, 5),
])
def test_exit_code_precedence(statuses, regressions, code):
    assert exit_code_for([_rec(s) for s in statuses], regressions=regressions) == code
