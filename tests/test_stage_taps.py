"""Stage taps: capture through a fake FA4 interface (CPU), the judge of the tapped buffers, the
detection curve and the runner's pipeline on the CPU stand-in."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify.mutants import detection as det  # noqa: E402
from fa4verify.kernels.stage_taps import capture_backward_stages  # noqa: E402


def _fake_interface(perm, sink_tensors=True, overrun=0):
    """A stand-in for flash_attn.cute.interface: _flash_attn_bwd calls the two drivers through
    module globals as FA4 does; dq_accum is stored in the permuted order ``perm``.
    ``sink_tensors=False``: the postprocess takes no ``sink_tensors`` (4.0.0b20..b25).
    ``overrun``: the preprocess also writes that many zeros right after the end of ``dpsum``
    (FA4 4.0.0b36's SM90 preprocess at tile_m 80 and head_dim_v 64 writes 16: Note [Scratch guard])."""
    mod = types.ModuleType("fake_interface")

    def pre(out, dout, dpsum, lse, lse_log2, dq_accum, *a, fake_mode=False, **kw):
        dpsum[:, :, :out.shape[1]] = (out.float() * dout.float()).sum(-1).transpose(1, 2)
        lse_log2[:, :, :out.shape[1]] = lse * math.log2(math.e)
        dq_accum.zero_()
        if overrun:     # through the storage, as a kernel's store would: past the tensor's end
            torch.as_strided(dpsum, (dpsum.numel() + overrun,), (1,))[dpsum.numel():] = 0.0

    def post(accum, output, scale, *a, fake_mode=False, sink_tensors=None, **kw):
        b, s, h, d = output.shape
        logical = accum[:, :, perm].reshape(b, h, s, d).transpose(1, 2)
        output.copy_((logical * scale).to(output.dtype))

    if not sink_tensors:
        def post(accum, output, scale, *a, fake_mode=False):   # noqa: F811 - the older signature
            b, s, h, d = output.shape
            output.copy_((accum[:, :, perm].reshape(b, h, s, d).transpose(1, 2) * scale).to(output.dtype))

    def bwd(q, out, dout, lse, scale):
        b, s, h, d = q.shape
        dpsum = torch.empty(b, h, s + 3)
        lse_log2 = torch.empty(b, h, s + 3)
        dq_accum = torch.empty(b, h, s * d)
        mod._bwd_preprocess(out, dout, dpsum, lse, lse_log2, dq_accum, None, fake_mode=False)
        dq_accum[:, :, perm] = (q.float() / scale).transpose(1, 2).reshape(b, h, s * d)  # "main kernel"
        dq = torch.empty_like(q)
        mod._bwd_postprocess_convert(dq_accum, dq, scale, None, None, fake_mode=False)
        return dq

    pre.compile_cache = {}
    mod._bwd_preprocess, mod._bwd_postprocess_convert, mod._flash_attn_bwd = pre, post, bwd
    return mod


@pytest.mark.parametrize("sink_tensors", [True, False])
def test_taps_capture_stage_buffers_and_restore_drivers(sink_tensors):
    b, s, h, d = 1, 8, 2, 4
    perm = torch.randperm(s * d, generator=torch.Generator().manual_seed(0))
    mod = _fake_interface(perm, sink_tensors)
    orig = (mod._bwd_preprocess, mod._bwd_postprocess_convert)
    g = torch.Generator().manual_seed(1)
    q = (torch.randint(-8, 8, (b, s, h, d), generator=g) / 4).to(torch.bfloat16)
    out, dout = torch.randn(b, s, h, d).to(torch.bfloat16), torch.randn(b, s, h, d).to(torch.bfloat16)
    lse = torch.randn(b, h, s)
    with capture_backward_stages(mod) as taps:
        dq = mod._flash_attn_bwd(q, out, dout, lse, 0.5)
    assert (mod._bwd_preprocess, mod._bwd_postprocess_convert) == orig
    assert taps.preprocess_calls == 1 and taps.postprocess_calls == 1 and taps.dq_scale == 0.5
    assert torch.all(taps.dq_accum_zeroed == 0)
    torch.testing.assert_close(taps.dpsum[:, :, :s], (out.float() * dout.float()).sum(-1).transpose(1, 2))
    logical = taps.dq_accum_logical(dq)      # decoded through the (fake) postprocess's own layout
    assert torch.equal(logical, q.float() / 0.5)


@pytest.mark.parametrize("overrun", [0, 16])
def test_the_scratch_guard_sees_a_write_past_the_preprocess_buffer_and_changes_nothing_else(overrun):
    """Note [Scratch guard]: the preprocess writes into a guarded view; what it wrote reaches FA4's
    own buffer (the backward goes on as before) and a write past the end is counted, per buffer."""
    b, s, h, d = 1, 8, 2, 4
    perm = torch.randperm(s * d, generator=torch.Generator().manual_seed(0))
    mod = _fake_interface(perm, overrun=overrun)
    g = torch.Generator().manual_seed(1)
    q = (torch.randint(-8, 8, (b, s, h, d), generator=g) / 4).to(torch.bfloat16)
    out, dout = torch.randn(b, s, h, d).to(torch.bfloat16), torch.randn(b, s, h, d).to(torch.bfloat16)
    from fa4verify.targets import armed_guard
    with capture_backward_stages(mod, guard=armed_guard) as taps:
        dq = mod._flash_attn_bwd(q, out, dout, torch.randn(b, h, s), 0.5)
    reps = {n: g.check() for n, g in taps.guards.items()}
    assert {n: (r.before, r.after) for n, r in reps.items()} == {"dpsum": (0, overrun), "lse_log2": (0, 0),
                                                                 "dq_accum": (0, 0)}
    assert {n: g.numel for n, g in taps.guards.items()} == {"dpsum": b * h * (s + 3), "lse_log2": b * h * (s + 3),
                                                            "dq_accum": b * h * s * d}
    torch.testing.assert_close(taps.dpsum[:, :, :s], (out.float() * dout.float()).sum(-1).transpose(1, 2))
    assert torch.equal(taps.dq_accum_logical(dq), q.float() / 0.5)


def test_a_write_past_the_preprocess_buffer_fails_bwd_stages_and_marks_the_examples_other_violations():
    """The judge's side of Note [Scratch guard]: an overrun is a ``bwd_stages`` violation
    (quantity ``scratch_bounds``), and every later violation of the same example carries it."""
    from fa4verify.determinism import GuardReport
    from fa4verify.fuzz.properties import _judge_scratch_guard
    from fa4verify.fuzz.violation import _EXAMPLE_FACTS, Violation, _fail
    from fa4verify.problem import AttentionProblem
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=137, seqlen_k=184, nheads=2, nheads_kv=2,
                         head_dim=128, head_dim_v=64)
    _judge_scratch_guard(p, {"dpsum": GuardReport("dpsum", 0, 0, (), 0)})   # nothing outside
    token = _EXAMPLE_FACTS.set({})
    try:
        with pytest.raises(Violation) as e:
            _judge_scratch_guard(p, {"dpsum": GuardReport("dpsum", 0, 16, (320, 321), 0),
                                     "lse_log2": GuardReport("lse_log2", 0, 0, (), 0)})
        assert e.value.prop == "bwd_stages" and e.value.metrics["quantity"] == "scratch_bounds"
        assert e.value.metrics["scratch_overrun"] == {"dpsum": 16} and "dpsum: 0 element(s) before it, 16 after it (first at offsets [320, 321])" in e.value.message
        with pytest.raises(Violation) as later:
            _fail(Violation("bwd_budget", "dq: planted", {"quantity": "dq"}))
        assert later.value.metrics["scratch_overrun"] == {"dpsum": 16}
    finally:
        _EXAMPLE_FACTS.reset(token)
    with pytest.raises(Violation) as outside:      # another example: nothing carried over
        _fail(Violation("bwd_budget", "dq: planted", {"quantity": "dq"}))
    assert "scratch_overrun" not in outside.value.metrics


def test_taps_restore_drivers_on_error():
    mod = _fake_interface(torch.arange(4))
    orig = mod._bwd_preprocess
    with pytest.raises(RuntimeError):
        with capture_backward_stages(mod):
            raise RuntimeError("boom")
    assert mod._bwd_preprocess is orig


def _problem(seed=3, b=1, s=64, h=1, d=32):
    from fa4verify.judge import attention as ja
    from fa4verify.mutants.source_worker import problem_inputs
    q, k, v, do = problem_inputs(seed, b, s, h, d)
    p = ja.dense_problem(q, k, v, arch="sm90", dtype="bf16", causal=True)
    a = ja.arrays_from(q, k, v, do)
    return ja, p, a, q, do


def test_d_tap_catches_a_2m10_bias_and_passes_the_exact_rowsum():
    import ml_dtypes
    from fa4verify.stages.taps import judge_taps
    ja, p, a, q, do = _problem()
    bs = ja.load_budgets("bf16", "sm90")
    of = ja.oracle_forward(p, a)
    O = np.asarray(of.out).astype(ml_dtypes.bfloat16).astype(np.float64)
    lse = np.asarray(of.lse, np.float32)
    fj = ja.judge_forward(p, a, O, lse, budgets=bs, oracle=of)
    ob = ja.oracle_backward(p, a)
    bj = ja.judge_backward(p, a, ob.dq, ob.dk, ob.dv, budgets=bs, forward=fj, oracle_bwd=ob)
    D = (O * do).sum(-1).transpose(0, 2, 1).astype(np.float32)
    scale = 1 / math.sqrt(q.shape[-1])
    taps = {"dpsum": D, "lse_log2": (lse * np.float32(math.log2(math.e))).astype(np.float32),
            "dq_accum_zeroed": np.zeros(4, np.float32), "dq_accum": (np.asarray(ob.dq) / scale).astype(np.float32)}
    v = judge_taps(p, a, O, lse, taps, budgets=bs, backward=bj)
    assert {n: x.status for n, x in v.items()} == {"D": "pass", "lse_log2": "pass", "dq_accum": "pass",
                                                   "dq_accum_zeroed": "pass"}
    bad = dict(taps, dpsum=(D * (1 + 2.0 ** -10)).astype(np.float32), dq_accum_zeroed=np.array([0, 1e-30]))
    v = judge_taps(p, a, O, lse, bad, budgets=bs, backward=bj)
    assert v["D"].status == "fail" and v["dq_accum_zeroed"].status == "fail"
    v = judge_taps(p, a, O, lse, {k: x for k, x in taps.items() if k != "dpsum"}, budgets=bs, backward=bj)
    assert v["D"].status == "undecided"


def test_detection_curve_reports_smallest_caught_and_monotonicity():
    from fa4verify.mutants.source import SourceMutant
    ms = [SourceMutant(f"f{k}", "", (), "fwd", (), family="f", bias=2.0 ** -k) for k in (7, 9, 11)]
    rec = lambda a, b: {"verdicts": {"out": {"worst_case": {"status": a}, "assert_close": {"status": b}}}}  # noqa: E731
    res = {"f7": rec("caught", "caught"), "f9": rec("caught", "missed"), "f11": rec("missed", "caught")}
    c = det.detection_curve(res, ms, "f")["out"]
    assert c["worst_case"]["smallest_caught"] == 2.0 ** -9 and c["worst_case"]["monotone"]
    assert c["assert_close"]["smallest_caught"] == 2.0 ** -11 and not c["assert_close"]["monotone"]


def test_verifier_registry_is_pluggable_and_crashes_are_undecided():
    def boom(case):
        raise ValueError("x")
    det.register_verifier("boom", boom)
    try:
        with pytest.raises(ValueError):
            det.register_verifier("boom", boom)
        case = det.TensorCase("lse", np.zeros(3), np.zeros(3), 0.0, 1e-6, "fp32")
        r = det.run_verifiers([case])["lse"]
        assert r["boom"]["status"] == "undecided" and r["worst_case"]["status"] == "missed"
        assert r["fa_rule"]["status"] == "n/a"
        case = det.TensorCase("lse", np.ones(3), np.zeros(3), 0.0, 1e-6, "fp32")
        assert det.run_verifiers([case])["lse"]["worst_case"]["status"] == "caught"
    finally:
        det.VERIFIERS.pop("boom")


@pytest.mark.slow
def test_runner_pipeline_on_cpu_stand_in(tmp_path):
    """The GPU script's entry point end to end on the CPU stand-in: the 2^-10 D bias is caught by
    the D tap, the control raises no alarm, the installed FA4 is unchanged."""
    import json
    from fa4verify.mutants import source_run as run
    rc = run.main(["--out", str(tmp_path / "o"), "--device", "cpu", "--jobs", "2",
                   "--mutants", "dpsum_bias_2m10", "--shape", "1,64,1,32", "--work", str(tmp_path / "w")])
    doc = json.loads((tmp_path / "o" / "source_mutants.json").read_text())
    assert rc == 0, doc["summary"]
    assert doc["summary"]["dpsum_bias_2m10"]["caught_by"]["worst_case"] == ["D"]
    assert doc["installed_unchanged"] and not doc["control_alarm"]
    assert doc["records"]["dpsum_bias_2m10"]["subject"] == "cpu-fake"


def test_runner_rejects_unknown_mutant_with_exit_2(tmp_path, capsys):
    from fa4verify.mutants import source_run as run
    assert run.main(["--out", str(tmp_path), "--mutants", "nope"]) == 2
    assert "error" in capsys.readouterr().err


def test_dlse_tap_passes_d_minus_dlse_and_fails_the_sign_flip():
    """Note [A gradient through the LSE]: D' = D - dLSE within d_pre_dlse; D + dLSE (the sign
    flipped) and D (dLSE ignored) fail; a missing capture is undecided."""
    import ml_dtypes
    from fa4verify.stages.taps import judge_dlse_tap
    ja, p, a, q, do = _problem()
    bs = ja.load_budgets("bf16", "sm90")
    O = np.asarray(ja.oracle_forward(p, a).out).astype(ml_dtypes.bfloat16).astype(np.float64)
    D = (O * do).sum(-1).transpose(0, 2, 1)
    dl = (np.random.default_rng(3).standard_normal(D.shape) * 0.5).astype(np.float32)
    good = (D.astype(np.float32) - dl).astype(np.float32)
    assert judge_dlse_tap(p, a, O, good, dl, budgets=bs).status == "pass"
    assert judge_dlse_tap(p, a, O, (D + dl).astype(np.float32), dl, budgets=bs).status == "fail"
    assert judge_dlse_tap(p, a, O, D.astype(np.float32), dl, budgets=bs).status == "fail"
    assert judge_dlse_tap(p, a, O, None, dl, budgets=bs).status == "undecided"


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_bwd_stages_runs_the_dlse_pass_on_a_target_that_takes_it(sign):
    """The property's plumbing: a target that takes ``dlse`` gets a second backward with one; its
    tapped D' and its gradients are judged (the twin applies FA4's preprocess step, ``D - dLSE``;
    the fault ``D + dLSE`` fails both)."""
    from fa4verify.fuzz import TwinTarget, Violation, check_problem
    from fa4verify.problem import AttentionProblem, ValueSpec
    seen = []

    class DlseTwin(TwinTarget):
        def backward(self, problem, a, fwd, *, deterministic=True, taps=None, dlse=None):
            if dlse is not None:
                seen.append(dlse.shape)
                dlse = -sign * np.asarray(dlse, np.float32)
            return super().backward(problem, a, fwd, deterministic=deterministic, taps=taps, dlse=dlse)
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=90, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=64, causal=True, values=ValueSpec("normal", 5))
    if sign < 0:
        out = check_problem(p, DlseTwin(), properties=["bwd_budget", "bwd_stages"])
        assert out.metrics["tightness_D_dlse"] <= 1 and seen == [(1, 2, 70)]
        assert all(0 < out.metrics[f"tightness_dlse_{n}"] <= 1 for n in ("dq", "dk", "dv"))
    else:
        with pytest.raises(Violation, match="D_dlse"):
            check_problem(p, DlseTwin(), properties=["bwd_budget", "bwd_stages"])


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("fault", [None, "scaled_dq", "dlse_dropped", "lse_only_stale_dout"])
def test_bwd_stages_judges_the_public_autograd_path(fault, varlen):
    """Note [The public autograd path]: a target with one gets its autograd gradients judged within
    the driver's budgets (a 10 % dQ error fails, named as the autograd path's), and with ``dlse``
    on a deterministic backward, bitwise against the driver's (a dropped dlse fails) -- on a
    varlen call too, where no stage is tapped (the escape measured on the H200 at 3c1e708)."""
    from fa4verify.fuzz import TwinTarget, Violation, check_problem
    from fa4verify.problem import AttentionProblem, ValueSpec
    calls = []

    class AutogradTwin(TwinTarget):
        def autograd_unsupported(self, problem):
            return None

        def backward_autograd(self, problem, a, *, deterministic=True, dlse=None, lse_only=False):
            if lse_only:            # a loss through the LSE alone: dO is zero (or stale memory: the fault)
                a = dict(a, dout=a["dout"] if fault == "lse_only_stale_dout" else np.zeros_like(a["dout"]))
            else:
                calls.append(dlse is not None)
            fwd = self.forward(problem, a)
            r = TwinTarget.backward(self, problem, a, fwd, deterministic=deterministic,
                                    dlse=None if fault == "dlse_dropped" else dlse)
            dq = r.dq
            if fault == "scaled_dq" and dlse is None:
                dq = dq * 1.1
            return type(r)(dq, r.dk, r.dv, r.dsink)
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=70, seqlen_k=90, nheads=2, nheads_kv=2,
                         head_dim=64, head_dim_v=64, causal=True, values=ValueSpec("normal", 5))
    if varlen:
        p = p.replace(batch=2, seqlens_q=(70, 33), seqlens_k=(90, 41))
    if fault is None:
        check_problem(p, AutogradTwin(), properties=["bwd_budget", "bwd_stages"])
        assert calls == [False, True]
    else:
        match = {"scaled_dq": "public autograd path", "dlse_dropped": "differs bitwise",
                 "lse_only_stale_dout": "a loss through the LSE alone"}[fault]
        with pytest.raises(Violation, match=match):
            check_problem(p, AutogradTwin(), properties=["bwd_budget", "bwd_stages"])


def test_the_production_target_hands_the_public_path_the_drivers_arguments():
    """Note [The public autograd path]: ProductionTarget.backward_autograd calls the adapter's
    autograd entry with the call's own arguments (varlen lengths, softcap, sink, deterministic,
    dlse) and returns its gradients, the sink's included. A call form goes with its own arrays
    (seqused_k over batched K, the gradients back in the problem's layout, a dLSE in the call's
    layout; none on a keep-pattern form); paged KV
    is refused (FA4 has no paged backward)."""
    import types
    import torch
    from fa4verify.errors import Unsupported
    from fa4verify.problem import AttentionProblem, CallForm, ValueSpec
    from fa4verify.targets import ProductionTarget
    seen = {}

    def fba(q, k, v, dout, **kw):
        seen.update(kw, shapes=(tuple(q.shape), tuple(dout.shape)))
        z = torch.zeros_like
        return (z(q), None, z(q) + 1, z(k) + 2, z(v) + 3, None if kw.get("learnable_sink") is None
                else torch.ones_like(kw["learnable_sink"]))
    t = ProductionTarget(adapter=types.SimpleNamespace(forward_backward_autograd=fba), device="cpu")
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=40, seqlen_k=33, nheads=2, nheads_kv=1,
                         head_dim=64, head_dim_v=64, seqlens_q=(40, 7), seqlens_k=(33, 20), softcap=30.0, sink=True,
                         values=ValueSpec("normal", 1))
    a = p.materialize()
    dl = np.zeros((2, 47), np.float32)
    g = t.backward_autograd(p, a, deterministic=True, dlse=dl)
    assert seen["shapes"] == ((47, 2, 64), (47, 2, 64)) and seen["softcap"] == 30.0 and seen["deterministic"] is True
    assert seen["cu_seqlens_q"].tolist() == [0, 40, 47] and seen["cu_seqlens_k"].tolist() == [0, 33, 53]
    assert seen["dlse"].shape == (2, 47) and seen["learnable_sink"] is not None
    assert (g.dq == 1).all() and (g.dk == 2).all() and (g.dv == 3).all() and (g.dsink == 1).all()
    pc = p.replace(call=CallForm(seqused_k=True, kv_capacity=40))
    seen.clear()
    g = t.backward_autograd(pc, a, deterministic=True)
    assert seen["seqused_k"].tolist() == [33, 20] and seen["shapes"][0] == (47, 2, 64)
    assert "cu_seqlens_k" not in seen or seen["cu_seqlens_k"] is None       # K batched (2, 40, ...)
    assert g.dk.shape == a["k"].shape and (g.dk == 2).all() and (g.dq == 1).all()
    seen.clear()
    t.backward_autograd(pc, a, deterministic=True, dlse=dl)        # the dLSE in the call's layout
    assert seen["dlse"].shape == (2, 47)                           # Q stays packed: the problem's
    with pytest.raises(Unsupported, match="block-sparse, CuTe mask_mod or MLA"):
        t.backward_autograd(p.replace(seqlens_q=None, seqlens_k=None, batch=1, seqlen_q=40, seqlen_k=33,
                                      call=CallForm(mask_mod_fn="checkerboard_128")), a, dlse=dl)
    with pytest.raises(Unsupported, match="paged"):
        t.backward_autograd(p.replace(call=CallForm(seqused_k=True, kv_capacity=48, page_size=16)), a)


def test_full_pages_hands_fa4_no_seqused_k_and_round_trips():
    import json
    import types
    from fa4verify.problem import AttentionProblem, CallForm
    from fa4verify.targets import ProductionTarget
    call = CallForm(seqused_k=True, kv_capacity=64, page_size=16, page_seed=3, full_pages=True)
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=9, seqlen_k=64, nheads=1, nheads_kv=1,
                         head_dim=64, head_dim_v=64, seqlens_q=(9, 4), seqlens_k=(64, 64), call=call)
    assert AttentionProblem.from_json(p.to_json()) == p and "full" in p.describe()
    t = ProductionTarget(adapter=types.SimpleNamespace(), device="cpu")
    _q, _k, _v, _do, kw = t._call_kw(p, p.materialize())
    assert "page_table" in kw and "seqused_k" not in kw
    _q, _k, _v, _do, kw = t._call_kw(p.replace(call=CallForm(seqused_k=True, kv_capacity=64, page_size=16,
                                                             page_seed=3)), p.materialize())
    assert "seqused_k" in kw
    with pytest.raises(ValueError, match="full_pages"):
        p.replace(seqlens_k=(64, 50))
    with pytest.raises(ValueError, match="full_pages"):
        CallForm(full_pages=True)
    assert "full_pages" not in json.dumps(CallForm(seqused_k=True, kv_capacity=64, page_size=16).to_dict())


@pytest.mark.parametrize("past", [0, 3])
def test_the_production_targets_gradient_buffers_are_guarded(past):
    """Note [Scratch guard] on FA4's gradient outputs: the production target hands FA4 NaN-filled
    guarded buffers (Note [Poisoned gradients]) whose bands see what the call wrote past them; a
    non-contiguous layout is poisoned without a guard."""
    from fa4verify.targets import ProductionTarget
    stub = types.SimpleNamespace(fake=False, _torch=torch)
    q, k = torch.zeros(2, 5, 3, 8, dtype=torch.bfloat16), torch.zeros(2, 7, 3, 8, dtype=torch.bfloat16)
    v = torch.zeros(2, 8, 3, 7, dtype=torch.bfloat16).transpose(1, 3)     # not contiguous
    bufs = ProductionTarget._poisoned(stub, q, k, v)
    assert all(torch.isnan(b.float()).all() for b in bufs.values()) and bufs["dk"].shape == k.shape
    torch.as_strided(bufs["dk"], (k.numel() + past,), (1,))[:] = 1.0      # the call writes dK, and past it
    bufs["dq"].zero_()
    assert {n: (r.before, r.after) for n, r in ((n, g.check()) for n, g in stub._grad_guards.items())} \
        == {"dq": (0, 0), "dk": (0, past)}


def _fake_forward_interface(*, unwritten=0, past=0, has_out=True, refuse=False):
    """A stand-in for FA4's forward driver: ``flash_attn_func`` calls ``_flash_attn_fwd`` through the
    module, which allocates O (and the LSE where asked or a gradient) unless given, then writes them:
    all but the last ``unwritten`` rows of O, and ``past`` elements after O's end. ``has_out=False``:
    an older driver without ``out`` / ``lse``; ``refuse``: it rejects a given ``out``."""
    mod = types.ModuleType("fake_fwd_interface")

    def drv(q, k, v, cu_seqlens_q=None, learnable_sink=None, qv=None, return_lse=False, out=None, lse=None):
        if refuse and out is not None:
            raise AssertionError("out must be allocated by FA4 here")
        b, s, h, _ = q.shape
        grad = any(t.requires_grad for t in (q, k, v))
        out = torch.empty(b, s, h, v.shape[-1], dtype=q.dtype) if out is None else out
        lse = (torch.empty(b, h, s) if lse is None else lse) if (grad or return_lse) else None
        o = (q.float().sum(-1, keepdim=True) * torch.ones(v.shape[-1])).to(q.dtype)
        out[:, : s - unwritten] = o[:, : s - unwritten]
        if lse is not None:
            lse.copy_(q.float().sum(-1).transpose(1, 2))
        if past:
            torch.as_strided(out, (out.numel() + past,), (1,))[out.numel():] = 0
        return out, lse

    if not has_out:
        def drv(q, k, v, cu_seqlens_q=None, learnable_sink=None, qv=None, return_lse=False):  # noqa: F811
            b, s, h, _ = q.shape
            return torch.zeros(b, s, h, v.shape[-1], dtype=q.dtype), torch.zeros(b, h, s)

    mod._flash_attn_fwd = drv
    mod.flash_attn_func = lambda q, k, v, return_lse=False: mod._flash_attn_fwd(q, k, v, return_lse=return_lse)
    return mod


@pytest.mark.parametrize("unwritten, past, grad, return_lse", [(0, 0, False, True), (2, 0, True, False),
                                                              (0, 5, False, False), (0, 0, False, False)])
def test_the_forward_outputs_are_nan_views_before_a_guard(unwritten, past, grad, return_lse):
    """Note [Scratch guard] on the forward: FA4's own O and LSE allocations replaced by guarded
    buffers -- a row FA4 leaves unwritten reads NaN, a write past O reaches the band -- and an LSE
    only where FA4 would allocate one (asked for, or a gradient)."""
    from fa4verify.kernels.stage_taps import guard_forward_outputs
    from fa4verify.targets import armed_guard
    mod = _fake_forward_interface(unwritten=unwritten, past=past)
    orig = mod._flash_attn_fwd
    q = torch.randn(2, 5, 3, 8).to(torch.bfloat16).requires_grad_(grad)
    k, v = torch.randn(2, 7, 3, 8).to(torch.bfloat16), torch.randn(2, 7, 3, 4).to(torch.bfloat16)
    with guard_forward_outputs(mod, armed_guard) as g:
        out, lse = mod.flash_attn_func(q, k, v, return_lse=return_lse)
    assert mod._flash_attn_fwd is orig and g.refused is None
    want = {"out": 2 * 5 * 3 * 4} | ({"lse": 2 * 3 * 5} if (grad or return_lse) else {})
    assert {n: b.numel for n, b in g.guards.items()} == want and (lse is not None) == ("lse" in want)
    assert {n: b.check().after for n, b in g.guards.items()} == {"out": past} | ({"lse": 0} if "lse" in want else {})
    assert torch.isnan(out.float()).any(dim=(0, 2, 3)).tolist() == [False] * (5 - unwritten) + [True] * unwritten


@pytest.mark.parametrize("variant", ["no_out_parameter", "refuses_a_given_out"])
def test_a_forward_that_cannot_take_guarded_outputs_runs_as_called(variant):
    from fa4verify.kernels.stage_taps import guard_forward_outputs
    from fa4verify.targets import armed_guard
    mod = _fake_forward_interface(has_out=variant != "no_out_parameter", refuse=variant == "refuses_a_given_out")
    q, k, v = (torch.randn(1, 3, 2, 8).to(torch.bfloat16) for _ in range(3))
    with guard_forward_outputs(mod, armed_guard) as g:
        out, _ = mod.flash_attn_func(q, k, v, return_lse=True)
    assert g.guards == {} and not torch.isnan(out.float()).any()
    assert (g.refused is not None) == (variant == "refuses_a_given_out")


def test_a_write_past_the_forwards_outputs_fails_fwd_budget():
    from fa4verify.determinism import GuardReport
    from fa4verify.fuzz.properties import _judge_scratch_guard
    from fa4verify.fuzz.violation import Violation
    from fa4verify.problem import AttentionProblem
    p = AttentionProblem(arch="sm90", dtype="bf16", batch=1, seqlen_q=8, seqlen_k=8, nheads=1, nheads_kv=1,
                         head_dim=64, head_dim_v=64)
    _judge_scratch_guard(p, {"out": GuardReport("out", 0, 0, (), 0), "lse": GuardReport("lse", 0, 0, (), 0)},
                         prop="fwd_budget", stage="forward")
    with pytest.raises(Violation) as e:
        _judge_scratch_guard(p, {"out": GuardReport("out", 2, 3, (-1, -2, 512), 0)}, prop="fwd_budget",
                             stage="forward")
    assert e.value.prop == "fwd_budget" and e.value.metrics == {"quantity": "scratch_bounds",
                                                                 "scratch_overrun": {"out": 5}}
    assert "FA4's forward wrote outside a buffer" in e.value.message
    assert "out: 2 element(s) before it, 3 after it (first at offsets [-1, -2, 512])" in e.value.message


def test_the_forward_guard_keeps_fa4s_name_signature_and_compile_key_names(tmp_path, monkeypatch):
    """The adapter reads the keywords a release takes and names the compile-key elements from FA4's
    function; under the guard it must still read FA4's (the wrapper forwards both), and a failure
    whose text merely contains 'out' is re-raised, not taken for a refusal of the buffers."""
    import importlib
    import sys
    from fa4verify.kernels import adapter
    from fa4verify.kernels.stage_taps import guard_forward_outputs
    (tmp_path / "fake_fa4_fwd.py").write_text(
        "def _flash_attn_fwd(q, k, v, causal=False, return_lse=False, out=None, lse=None):\n"
        "    compile_key = (q.dtype, causal, lse is None)\n"
        "    if causal:\n"
        "        raise AssertionError('causal is not supported without a layout here')\n"
        "    return out, lse\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("fake_fa4_fwd")
    try:
        orig = mod._flash_attn_fwd
        want_names, want_params = adapter._compile_key_names(orig), adapter._parameters(orig)
        q = torch.zeros(1, 2, 1, 8, dtype=torch.bfloat16)
        from fa4verify.targets import armed_guard
        with guard_forward_outputs(mod, armed_guard) as g:
            assert mod._flash_attn_fwd is not orig
            assert adapter._compile_key_names(mod._flash_attn_fwd) == want_names == [["q.dtype", "causal", "lse is None"]]
            assert adapter._parameters(mod._flash_attn_fwd) == want_params
            with pytest.raises(AssertionError, match="without a layout"):
                mod._flash_attn_fwd(q, q, q, causal=True)
        assert g.refused is None and mod._flash_attn_fwd is orig
    finally:
        sys.modules.pop("fake_fa4_fwd", None)
