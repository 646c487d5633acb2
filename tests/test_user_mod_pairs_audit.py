"""A user's score_mod / mask_mod pair is audited like a built-in (issue 26): registered in the
auditing process -- here by a module loaded as ``--checks-module`` files are loaded -- it is drawn
by the fuzz.production campaign (drawn in a fresh process: Note [Pairs in a fresh process]) and
planned by coverage.production. Both checks run their own code here, on the CPU, with stand-ins
for the GPU, the production target and the example runner (which records what it was given)."""
from __future__ import annotations

import sys
import textwrap
import types

import pytest

from fa4verify import mods
from fa4verify.audit import registry
from fa4verify.run.engine import run_here

PAIR_MODULE = textwrap.dedent('''
    import numpy as np

    from fa4verify import mods
    from fa4verify.kernels.mods import ModPair

    mods.register_mod_pair(ModPair("my_bias", "score", lambda x, b, h, qi, ki, a: x + 0.25,
                                   grad=lambda x, *r: np.ones_like(x),
                                   err=lambda x, y, *r: 2.0 ** -24 * (np.abs(x) + 0.25)))
''')


@pytest.fixture()
def user_pair(tmp_path):
    path = tmp_path / "my_pairs.py"
    path.write_text(PAIR_MODULE)
    mod = registry.load_module(str(path))          # what --checks-module does
    assert "my_bias" in mods.names()
    yield path
    mods.unregister("my_bias")
    sys.modules.pop(mod.__name__, None)


@pytest.fixture()
def stand_ins(monkeypatch):
    """A stand-in H200 and production target; the example runner records the problems."""
    from fa4verify import fuzz, targets
    from fa4verify.fuzz import drawn

    class Production:
        name = "production"

        def features(self):
            return targets.production_features()

        def describe(self):
            return {"target": "production", "where": "stand-in"}

    ran: dict[str, list] = {}

    def run_drawn(problems, indices, *, target, **kw):
        ran.setdefault("problems", []).extend(problems[j] for j in indices)
        outs = [{"index": int(j), "digest": problems[j].digest(), "describe": problems[j].describe(),
                 "known": [], "status": "not_run"} for j in indices]
        return {"outcomes": outs, "seconds": 0.0, "target": target.describe()}

    monkeypatch.setattr(fuzz, "ProductionTarget", Production)
    monkeypatch.setattr(targets, "ProductionTarget", Production)
    monkeypatch.setattr(drawn, "run_drawn", run_drawn)
    monkeypatch.setattr(registry.CheckContext, "require_gpu", lambda self, note="": types.SimpleNamespace(arch="sm90"))
    monkeypatch.setattr(registry.CheckContext, "where_measured", lambda self: "measured on NVIDIA H200 (sm_90)")
    return ran


def test_the_fuzz_production_campaign_draws_a_registered_user_pair(user_pair, stand_ins):
    from fa4verify.checks import fuzz as F
    ctx = registry.CheckContext(device="cuda", arch="sm90", profile="default", seed=0, check_id="fuzz.production")
    r = run_here(F.production.__fa4verify_check__, ctx)
    drawn = stand_ins["problems"]
    assert len(drawn) >= 40 and r.status != "pass"        # nothing was judged: never a pass
    mine = [p for p in drawn if "my_bias" in p.mods]
    assert mine, sorted({m for p in drawn for m in p.mods})
    assert all(p.mod_pairs()[0].name == "my_bias" for p in mine)


def test_a_pair_the_fresh_drawer_cannot_import_is_refused_by_name(stand_ins):
    """A pair registered outside any importable module (here: in this test's body, recorded as
    this test module, which registers nothing when imported) is not silently left out."""
    import numpy as np

    from fa4verify.checks import fuzz as F
    from fa4verify.kernels.mods import ModPair
    mods.register_mod_pair(ModPair("not_importable", "score", lambda x, *r: x,
                                   grad=lambda x, *r: np.ones_like(x), err=lambda x, y, *r: 0.0 * x))
    try:
        ctx = registry.CheckContext(device="cuda", arch="sm90", profile="default", seed=0,
                                    check_id="fuzz.production")
        with pytest.raises(RuntimeError, match="not_importable cannot be drawn"):
            F.production.__fa4verify_check__.cases(ctx)           # the draw: the check's cases
    finally:
        mods.unregister("not_importable")


def test_the_coverage_plan_runs_every_registered_pair(user_pair, stand_ins):
    from fa4verify.checks import coverage as C
    ctx = registry.CheckContext(device="cuda", arch="sm90", profile="default", seed=0,
                                check_id="coverage.production")
    r = run_here(C.production.__fa4verify_check__, ctx)
    rows = r.details["plan"]["row_values"]
    problems = stand_ins["problems"]
    edges = r.details["plan_coverage"]["edge_cases"]
    assert len(problems) == len(rows) + len(edges) and r.status != "pass"
    space = r.details["plan"]["space"]
    assert "mod:my_bias" in space["score_pairs"]
    used = {r_["pair"] for r_ in rows if "pair" in r_}
    assert used >= set(space["score_pairs"]) | set(space["mask_pairs"])
    assert any(p.mods == ("my_bias",) for p in problems)
