"""Note [Siblings share compile keys] (fa4verify._strategies.problem.problem_groups): a drawn
production problem's siblings change only what FA4 does not compile for (the values; a varlen
batch's lengths below its maxima), the draw stays deterministic, and siblings=0 is the old draw."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from fa4verify._strategies.problem import attention_problems, problem_groups
from fa4verify.fuzz import drawn
from fa4verify.kernels.adapter import compile_key
from fa4verify.targets import production_features

_FEATS = production_features()


def _kernel_part(p):
    """Everything of a problem but what a sibling may change."""
    d = dataclasses.asdict(p)
    d.pop("values")
    if p.varlen and p.call is None:
        d.pop("seqlens_q")
        d.pop("seqlens_k")
    return d


@settings(max_examples=60, deadline=None)
@given(problem_groups(attention_problems(arch="sm90", dtype="bf16", features=_FEATS,
                                         head_dim_choices=(8, 64, 128)), siblings=2))
def test_siblings_keep_everything_fa4_compiles_for(group):
    base, *sibs = group
    assert len(sibs) == 2
    for s in sibs:
        assert _kernel_part(s) == _kernel_part(base)
        assert (s.seqlen_q, s.seqlen_k, s.batch) == (base.seqlen_q, base.seqlen_k, base.batch)
        assert compile_key(s) == compile_key(base)
        if s.varlen:
            assert (max(s.seqlens_q), max(s.seqlens_k)) == (base.seqlen_q, base.seqlen_k)


def test_varlen_siblings_also_vary_the_lengths():
    seen = []

    @settings(max_examples=80, deadline=None)
    @given(problem_groups(attention_problems(arch="sm90", dtype="bf16", features=("varlen",),
                                             max_batch=3), siblings=1))
    def run(group):
        base, sib = group
        if base.varlen and base.batch > 1:
            seen.append(sib.seqlens_q != base.seqlens_q or sib.seqlens_k != base.seqlens_k)
    run()
    assert seen and any(seen)


def test_negative_siblings_are_refused():
    with pytest.raises(ValueError, match="siblings"):
        drawn.draw_problems(arch="sm90", dtype="bf16", examples=4, seed=0, siblings=-1)
    with pytest.raises(Exception, match="siblings"):
        problem_groups(attention_problems(), siblings=-1).example()


def _draw(sib, seed=0):
    return drawn.draw_problems(arch="sm90", dtype="bf16", examples=24, seed=seed, profile="ci", features=_FEATS,
                               limits={"head_dim_choices": (8, 64, 128), "max_head_dim": 256}, siblings=sib)


def test_a_sibling_draw_is_deterministic_and_repeats_kernels():
    a, b = _draw(1), _draw(1)
    assert [p.digest() for p in a] == [p.digest() for p in b]
    assert len(a) == 24 and len({p.digest() for p in a}) == 24
    plain = _draw(0)
    kern = lambda ps: len({repr(sorted(_kernel_part(p).items())) for p in ps})  # noqa: E731
    # the same number of examples runs over fewer distinct kernel configurations
    assert kern(a) < kern(plain)
    # a sibling follows its base: at least one (base, sibling) pair of equal kernel parts in a row
    assert any(_kernel_part(x) == _kernel_part(y) and x.values != y.values for x, y in zip(a, a[1:]))


def test_the_production_check_takes_siblings_from_the_profile_or_the_option():
    from fa4verify.checks import fuzz as cf

    class Ctx:
        def __init__(self, profile, options=None):
            self.profile, self.options = profile, options or {}
    assert cf._siblings(Ctx("default")) == 1
    assert cf._siblings(Ctx("full")) == 0 and cf._siblings(Ctx("exhaustive")) == 0
    assert cf._siblings(Ctx("default", {"fuzz_siblings": "3"})) == 3
    for bad in ("-1", "two"):
        with pytest.raises(ValueError, match="fuzz_siblings"):
            cf._siblings(Ctx("default", {"fuzz_siblings": bad}))


@settings(max_examples=80, deadline=None)
@given(problem_groups(attention_problems(arch="sm90", dtype="bf16", features=("varlen", "causal"), max_batch=3,
                                         max_seqlen=260, max_work=400_000), siblings=2, max_work=400_000))
def test_siblings_stay_inside_the_work_bound_of_their_draw(group):
    """A varlen sibling's new lengths never take it past the profile's max_work (review, session 7:
    siblings of 1.7 M-14.6 M work under the ci profile's 1.5 M bound); it keeps the lengths then."""
    assert all(p.work <= 400_000 for p in group)


def test_the_audit_fuzz_draws_only_the_distributions_its_option_names():
    """``--opt fuzz_distributions=huge`` reaches the drawn campaign (the large-logit regime on the
    GPU); an unknown name is a one-line ValueError (the CLI's exit 2), never ignored."""
    from fa4verify.checks import fuzz as cf
    from fa4verify.fuzz import drawn

    class Ctx:
        profile, deploy, seed = "default", None, 0

        def __init__(self, options):
            self.options = options
    kw = cf._deployment_kw(Ctx({"fuzz_distributions": "huge"}), {}, call_features=True)
    assert kw["distributions"] == ["huge"]
    probs = drawn.draw_problems(arch="sm90", dtype="bf16", examples=12, seed=0, profile="ci",
                                features=("causal",), **{k: v for k, v in kw.items() if k != "features"})
    assert {p.values.distribution for p in probs} == {"huge"}
    assert "distributions" not in cf._deployment_kw(Ctx({}), {})
    with pytest.raises(ValueError, match="fuzz_distributions"):
        cf._deployment_kw(Ctx({"fuzz_distributions": "gigantic"}), {})


def test_a_campaign_narrowed_to_some_distributions_says_so():
    from fa4verify.checks import fuzz as cf

    class Ctx:
        profile, deploy, seed = "default", None, 0

        def __init__(self, options):
            self.options = options
    assert cf._distributions_extra(Ctx({"fuzz_distributions": "huge,tiny"})) == {"distributions_drawn_from":
                                                                                  ["huge", "tiny"]}
    assert cf._distributions_extra(Ctx({})) == {}
