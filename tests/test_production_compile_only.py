"""Compile-only SM100 production FA4 through the production-target code path (no GPU).

``ProductionTarget(fake=True)`` runs FA4 forward and backward (deterministic and default, and
with ``emulation="disabled"``) under torch FakeTensorMode in ONE subprocess per compile target
(:func:`fa4verify.compile.production.run_cases`: the census' env vars and CPU shims stay in the child).
Every assertion is about what compiled: FA4's compile key as recorded by the adapter says arch
100 (103), the kernel classes the DSL dumped during the call are SM100's forward / backward, the
output shapes are right, and ``where`` is "compile-only". Two deliberately broken SM100 paths run
in the same subprocess and must be flagged by the same check (:func:`_problems`).

Measured here (2-core CPU box, FA4 4.0.0b36, DSL 4.8.1; compile-only): the default subset (sm_100a
hd128 non-causal: forward, backward deterministic and default, forward + backward with emulation
disabled, two injected failures) is one subprocess of about 55-65 s (import ~8 s, ~5-10 s per
compile). FA4VERIFY_SLOW=1 adds hd 64/128 x causal/non-causal for sm_100a and an sm_103a
subprocess (about 3-4 more minutes).
"""
from __future__ import annotations

import os

import pytest

# fa4: skipped with the reason without flash-attn-4 / the DSL (tests/conftest.py); slow: the
# module fixture is one compile subprocess of about 55-65 s
pytestmark = [pytest.mark.fa4, pytest.mark.slow]
SLOW = os.environ.get("FA4VERIFY_SLOW") == "1"

FAMILY = {("forward", 100): "FlashAttentionForwardSm100", ("backward", 100): "FlashAttentionBackwardSm100",
          ("forward", 103): "FlashAttentionForwardSm100", ("backward", 103): "FlashAttentionBackwardSm100"}


def _cases(slow: bool):
    from fa4verify.compile.production import CompileCase as C
    cs = [C("forward", 128, False), C("backward", 128, False, deterministic=True),
          C("backward", 128, False, deterministic=False),
          C("forward", 128, False, emulation="disabled"),
          C("backward", 128, False, deterministic=True, emulation="disabled"),
          # deliberately broken SM100 paths (must be flagged by _problems)
          C("forward", 128, False, inject="raise"),
          C("backward", 128, False, deterministic=True, inject="skip-fa4")]
    if slow:
        for hd in (64, 128):
            for causal in (False, True):
                if (hd, causal) == (128, False):
                    continue
                cs += [C("forward", hd, causal), C("backward", hd, causal, deterministic=True),
                       C("backward", hd, causal, deterministic=False)]
    return cs


def _problems(r: dict, arch: int) -> list[str]:
    """Everything that says the production SM100 path did NOT compile for this case."""
    out = []
    case = r["case"]
    op = case["op"]
    if not r["ok"]:
        return [f"call failed: {r['error']}"]
    if r["where"] != "compile-only":
        out.append(f"where={r['where']!r}")
    cfg = r["backward_config"] if op == "backward" else r["forward_config"]
    if not cfg:
        return out + ["no CallConfig recorded"]
    key = cfg.get("compile_key") or {}
    if not key:
        out.append("no FA4 compile key recorded (FA4's JIT cache was never consulted)")
    if cfg.get("arch") != arch or key.get("arch") != arch:
        out.append(f"arch: config {cfg.get('arch')}, compile key {key.get('arch')}, expected {arch}")
    if op == "backward" and key.get("deterministic") is not case["deterministic"]:
        out.append(f"compile key deterministic={key.get('deterministic')}, asked {case['deterministic']}")
    fam = FAMILY[(op, arch)]
    if fam not in r["kernels"]:
        out.append(f"{fam} not compiled during the call (dumped: {r['kernels']})")
    for k, v in r["expected_shapes"].items():
        if r["shapes"].get(k) != v:
            out.append(f"{k} shape {r['shapes'].get(k)} != {v}")
    if case["emulation"] == "disabled" and op == "forward":
        if "disabled" not in str(cfg.get("exp2_emulation")) or cfg.get("emulated_share") != 0.0:
            out.append(f"emulation not disabled: {cfg.get('exp2_emulation')} share {cfg.get('emulated_share')}")
    if case["emulation"] == "default" and op == "forward" and arch == 100 and not cfg.get("emulated_share"):
        out.append(f"SM100 forward with FA4's default tuning has no emulated share: {cfg.get('emulated_share')}")
    return out


@pytest.fixture(scope="module")
def sm100(tmp_path_factory):
    from fa4verify.compile.production import run_cases
    run = run_cases("sm_100a", _cases(SLOW), tmp_path_factory.mktemp("co100"))
    print(f"\ncompile-only sm_100a: {len(run['results'])} cases in {run['wall_seconds']} s "
          f"(import {run['import_seconds']} s): " +
          ", ".join(f"{r['label']} {r['seconds']} s" for r in run["results"]))
    return run


def _good(run):
    return [r for r in run["results"] if not r["case"]["inject"]]


def test_sm100_production_compiles_forward_and_backward(sm100):
    good = _good(sm100)
    assert len(good) >= 5
    bad = {r["label"]: p for r in good if (p := _problems(r, 100))}
    assert not bad, bad
    ops = {(r["case"]["op"], r["case"]["deterministic"], r["case"]["emulation"]) for r in good}
    assert {("forward", False, "default"), ("backward", True, "default"), ("backward", False, "default"),
            ("forward", False, "disabled")} <= ops


def test_sm100_backward_modes_are_distinct_compiles(sm100):
    """deterministic=True and the default are different FA4 kernels (compile keys differ in
    ``deterministic``) and each compiled SM100's backward + pre/postprocess."""
    bw = [r for r in _good(sm100) if r["case"]["op"] == "backward" and r["case"]["emulation"] == "default"
          and r["case"]["head_dim"] == 128 and not r["case"]["causal"]]
    keys = {r["case"]["deterministic"]: r["backward_config"]["compile_key"] for r in bw}
    assert set(keys) == {True, False}
    assert keys[True] != keys[False]
    assert keys[True]["deterministic"] is True and keys[False]["deterministic"] is False
    for r in bw:
        assert r["backward_config"]["op"] == "backward"
        assert r["backward_config"]["entry"] == "_flash_attn_bwd"
        assert r["values_are_zero"] is True       # compile-only: shapes, not values
        assert r["describe"]["where"] == "compile-only" and r["describe"]["arch"] == "sm100"


def test_sm100_emulation_disabled_recompiles_the_forward(sm100):
    r = next(r for r in _good(sm100) if r["case"]["emulation"] == "disabled" and r["case"]["op"] == "forward")
    d = next(r for r in _good(sm100) if r["case"]["emulation"] == "default" and r["case"]["op"] == "forward"
             and r["case"]["head_dim"] == 128 and not r["case"]["causal"])
    assert "FlashAttentionForwardSm100" in r["kernels"]
    assert r["describe"]["exp2_emulation"] == "disabled"
    assert r["forward_config"]["emulated_share"] == 0.0 < d["forward_config"]["emulated_share"]


def test_broken_sm100_path_is_caught(sm100):
    """The test can fail: an adapter that raises, and a stand-in that returns the right shapes and
    claims arch 100 without calling FA4, are both flagged by the same check."""
    inj = {r["case"]["inject"]: r for r in sm100["results"] if r["case"]["inject"]}
    assert set(inj) == {"raise", "skip-fa4"}
    p_raise = _problems(inj["raise"], 100)
    assert p_raise and "injected: broken SM100 forward path" in p_raise[0]
    p_skip = _problems(inj["skip-fa4"], 100)
    assert any("compile key" in p for p in p_skip), p_skip
    assert any("FlashAttentionBackwardSm100 not compiled" in p for p in p_skip), p_skip
    # ... while its shapes alone would have passed
    assert inj["skip-fa4"]["shapes"]["dq"] == inj["skip-fa4"]["expected_shapes"]["dq"]


_ENV_AT_IMPORT = {k: os.environ.get(k) for k in (
    "CUTE_DSL_ARCH", "CUTE_DSL_KEEP", "CUTE_DSL_DUMP_DIR", "FLASH_ATTENTION_ARCH", "FLASH_ATTENTION_NUM_SMS")}


def test_compile_only_env_does_not_leak_into_this_process(sm100):
    assert {k: os.environ.get(k) for k in _ENV_AT_IMPORT} == _ENV_AT_IMPORT
    import torch
    assert getattr(torch.cuda.current_device, "__name__", "") != "<lambda>"


@pytest.mark.slow(extended="the sm_103a subprocess (about 3-4 minutes)")
def test_sm103_production_compiles_forward_and_backward(tmp_path_factory):
    from fa4verify.compile.production import CompileCase as C, run_cases
    run = run_cases("sm_103a", [C("forward", 128, False), C("backward", 128, False, deterministic=True),
                                C("backward", 128, False, deterministic=False),
                                C("forward", 64, True)], tmp_path_factory.mktemp("co103"))
    print(f"\ncompile-only sm_103a: {len(run['results'])} cases in {run['wall_seconds']} s "
          f"(import {run['import_seconds']} s): " +
          ", ".join(f"{r['label']} {r['seconds']} s" for r in run["results"]))
    bad = {r["label"]: p for r in run["results"] if (p := _problems(r, 103))}
    assert not bad, bad
    fwd = run["results"][0]["forward_config"]
    assert fwd["tuning_key"][3] is True          # is_sm103 in the SM100 tuning key


def test_sm100_emulation_off_with_the_kernel_cache_on(tmp_path):
    """Issue 30 (build item 7): with FA4's persistent cache on -- an audit's default --
    ``exp2_emulation_disabled()`` used to raise, so budgets.production.forward errored on every
    B200 audit. Compile-only: the default and the emulation-off SM100 forward both compile with
    the cache on, and their objects land in separate directories under the arch's, each with its
    integrity manifest (Note [Kernel cache integrity])."""
    from fa4verify.compile.production import CompileCase as C, run_cases
    kc = tmp_path / "kc"
    kc.mkdir(mode=0o700)
    run = run_cases("sm_100a", [C("forward", 128, False), C("forward", 128, False, emulation="disabled")],
                    tmp_path / "work", kernel_cache=kc)
    res = run["results"]
    assert [r["ok"] for r in res] == [True, True], [r["error"] for r in res]
    bad = {r["label"]: p for r in res if (p := _problems(r, 100))}
    assert not bad, bad
    assert res[1]["forward_config"]["emulated_share"] == 0.0 < res[0]["forward_config"]["emulated_share"]
    objs = {p.parent.name: p for p in kc.rglob("*.o")}
    assert {"fwd", "fwd-ex2emu-off"} <= set(objs), sorted(str(p.relative_to(kc)) for p in kc.rglob("*"))
    for name in ("fwd", "fwd-ex2emu-off"):
        o = objs[name]
        assert o.relative_to(kc).parts[0] == "sm100a"
        import hashlib
        assert (o.parent / (o.name + ".sha256")).read_text().strip() == hashlib.sha256(o.read_bytes()).hexdigest()


def test_a_planned_forward_only_row_compiles_its_forward_alone():
    """Note [Fake device audit]: a planned row the space runs forward only (FA4's SM90 backward does
    not build at head dim 104, known issue sm90_bwd_hd104_112_compile) is compiled as the GPU run
    calls it, its forward alone; a row with a backward compiles it (with its dLSE variant)."""
    from fa4verify.checks.fuzz import DrawnCase, campaign_compiles
    from fa4verify.problem import AttentionProblem
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=90, nheads=2, nheads_kv=2,
                         head_dim=104, head_dim_v=104)
    head = {"properties": ("runs", "fwd_budget", "bwd_budget", "bwd_stages")}
    calls = campaign_compiles([DrawnCase(0, p, "production", head, backward=False),
                               DrawnCase(1, p.replace(head_dim=128, head_dim_v=128), "production", head)])
    assert [(c.op, c.problem.head_dim) for c in calls] == [("forward", 104), ("backward", 128)]
    assert calls[1].dlse and calls[1].deterministic
