"""The harness end to end on the CPU: reproducible results pass, and every kind of injected
non-determinism, out-of-bounds write, unwritten element or rejection is reported as such.

The backends here wrap the fp32 PyTorch reference (``torch-math``) and break it on purpose; they
test the harness, not FA4.
"""
from __future__ import annotations

import importlib
import dataclasses
import os
import sys
import textwrap
import types

import pytest

torch = pytest.importorskip("torch")

from fa4verify import determinism as d
from fa4verify.determinism import backends
from fa4verify import errors

CFG = d.MATRICES["cpu"][0]      # mha-hd64-full
CFG_GQA = d.MATRICES["cpu"][1]  # gqa causal


def test_reference_backend_is_reproducible_in_process():
    rec = d.run_config(d.TorchMathBackend(), CFG, "cpu", runs=4, default_runs=3)
    assert rec["status"] == "ok", rec.get("reason")
    for t in ("dq", "dk", "dv"):
        dg = rec["det"]["digests"][t]
        assert len(dg) == 1 and next(iter(dg.values()))["count"] == 4
    assert rec["det"]["guard_violations"] == [] and rec["det"]["unwritten"] == []
    assert rec["det"]["buffers_not_used"] == []
    rep = d.aggregate([dict(results=[rec], process_index=0)], [CFG])
    assert rep["configs"][0]["status"] == "reproducible"
    assert d.exit_status(rep) == 0


class PerRunFlip(d.TorchMathBackend):
    """Flips the lowest bit of dq[r % n] on deterministic run r >= 1."""
    def __init__(self):
        self.calls = 0

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
        g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
        if deterministic and self.calls:
            flat = g.dq.view(-1).view(torch.int16)
            flat[self.calls % flat.numel()] ^= 1
        self.calls += 1
        return g


def test_one_bit_difference_in_one_run_is_not_reproducible():
    rec = d.run_config(PerRunFlip(), CFG, "cpu", runs=3, default_runs=0)
    rep = d.aggregate([dict(results=[rec])], [CFG])
    c = rep["configs"][0]
    assert c["status"] == "not-reproducible"
    assert c["distinct_digests"] == {"dq": 3}
    assert set(c["digests"]) == {"dk", "dv"}
    assert d.exit_status(rep) == 1
    # an upstream-xfail configuration is reported as xfail instead, on that arch only
    xcfg = dataclasses.replace(CFG, upstream_xfail=(("sm90", "upstream says so"),))
    rec2 = d.run_config(PerRunFlip(), xcfg, "cpu", runs=2)
    rep2 = d.aggregate([dict(results=[rec2], arch="sm90")], [xcfg])
    assert rep2["configs"][0]["status"] == "xfail" and d.exit_status(rep2) == 0
    rep3 = d.aggregate([dict(results=[rec2], arch="sm100")], [xcfg])
    assert rep3["configs"][0]["status"] == "not-reproducible"


class DefaultNoise(d.TorchMathBackend):
    """Default mode: run r adds (r % 3) to the bits of dq[0] and dk[5]."""
    def __init__(self):
        self.r = 0

    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
        g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
        if not deterministic:
            for t, i in ((g.dq, 0), (g.dk, 5)):
                b = t.view(-1).view(torch.int16)
                b[i] += self.r % 3
            self.r += 1
        return g


def test_default_mode_divergence_counts_elements_and_ulps():
    n = 7
    rec = d.run_config(DefaultNoise(), CFG, "cpu", runs=2, default_runs=n)
    rep = d.aggregate([dict(results=[rec])], [CFG])
    c = rep["configs"][0]
    assert c["status"] == "reproducible"
    dm = c["default_mode"]["tensors"]
    expected_runs = sum(1 for r in range(1, n) if r % 3)
    for t in ("dq", "dk"):
        assert dm[t]["runs_compared"] == n - 1
        assert dm[t]["runs_differing"] == expected_runs
        assert dm[t]["max_differing_elements"] == 1 and dm[t]["max_ulp"] == 2
        assert dm[t]["distinct_results"] == 3
        assert dm[t]["vs_deterministic_differing"] == 0  # default run 0 adds 0
    assert dm["dv"]["runs_differing"] == 0 and dm["dv"]["max_ulp"] == 0


class OutOfBounds(d.TorchMathBackend):
    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
        g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
        wide = torch.as_strided(dk, (dk.numel() + 2,), (1,), dk.storage_offset())
        wide[-1] = 0.5  # the second element past the end of dk
        return g


def test_out_of_bounds_write_is_a_guard_violation():
    rec = d.run_config(OutOfBounds(), CFG, "cpu", runs=2)
    rep = d.aggregate([dict(results=[rec])], [CFG])
    c = rep["configs"][0]
    assert c["status"] == "guard-violation"
    gv = c["guard_violations"][0]
    n = CFG.batch * CFG.seqlen_k * CFG.nheads_kv * CFG.head_dim
    assert gv["name"] == "dk" and gv["after"] == 1 and gv["first_offsets"] == [n + 1]
    assert d.exit_status(rep) == 1


class LeavesOneUnwritten(d.TorchMathBackend):
    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
        g = super().backward(p, out, lse, deterministic=deterministic)
        dq.view(-1)[1:].copy_(g.dq.reshape(-1)[1:])
        dk.copy_(g.dk)
        dv.copy_(g.dv)
        return d.Grads(dq, dk, dv)


def test_element_never_written_is_reported_unwritten():
    rec = d.run_config(LeavesOneUnwritten(), CFG, "cpu", runs=2)
    c = d.aggregate([dict(results=[rec])], [CFG])["configs"][0]
    assert c["status"] == "unwritten"
    assert c["unwritten"][0]["tensor"] == "dq" and c["unwritten"][0]["nan"] == 1


class CopiesInsteadOfWriting(d.TorchMathBackend):
    def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
        g = super().backward(p, out, lse, deterministic=deterministic)
        dq.zero_(), dk.zero_(), dv.zero_()
        return g


def test_result_not_in_the_given_buffers_is_flagged():
    rec = d.run_config(CopiesInsteadOfWriting(), CFG, "cpu", runs=2)
    c = d.aggregate([dict(results=[rec])], [CFG])["configs"][0]
    assert rec["det"]["buffers_not_used"] == ["dk", "dq", "dv"]
    assert any("did not write into the given buffers" in p for p in c["problems"])


class RejectsDeterministic(d.TorchMathBackend):
    unsupported_msg = d.UNSUPPORTED_MSG  # stands in for FA4 rejecting the configuration

    def backward(self, p, out, lse, *, deterministic, **kw):
        if deterministic:
            raise errors.Unsupported("deterministic backward not supported on SM 12.0")
        return super().backward(p, out, lse, deterministic=deterministic, **kw)


def test_rejected_configuration_is_unsupported_not_a_crash():
    rec = d.run_config(RejectsDeterministic(), CFG, "cpu", runs=2, default_runs=2)
    rep = d.aggregate([dict(results=[rec])], [CFG])
    c = rep["configs"][0]
    assert c["status"] == "unsupported"
    assert "deterministic mode not supported by FA4 for this configuration" in c["reason"]
    assert "SM 12.0" in c["reason"]
    assert d.exit_status(rep) == 5  # nothing ran


def test_fa4_backend_classifies_fa4_rejections_as_unsupported():
    """Note [Blame]: FA4's refusals (raised in a flash_attn frame), a feature the release lacks and
    the adapter's own refusals are unsupported; the same exception types raised in fa4verify's own
    call, and crashes, are errors (never "not reproducible")."""
    from fa4verify.kernels import adapter
    be = object.__new__(d.Fa4Backend)
    be.adapter = adapter
    fa4: dict = {}
    exec(compile("def fa4(e):\n    raise e\n", "/site-packages/flash_attn/cute/interface.py", "exec"), fa4)

    def raised_in_fa4(e):
        try:
            fa4["fa4"](e)
        except Exception as got:  # noqa: BLE001
            return got
    assert be.classify(raised_in_fa4(AssertionError("GQA backward requires head_dim == head_dim_v"))) == \
        "unsupported"
    assert be.classify(raised_in_fa4(ValueError("requires 2CTA"))) == "unsupported"
    assert be.classify(adapter.UnsupportedByRelease("_flash_attn_bwd", "learnable_sink", 1.0)) == "unsupported"
    assert be.classify(adapter.AdapterRefusal("mask_mod with causal")) == "unsupported"
    assert be.classify(raised_in_fa4(RuntimeError("CUDA error: an illegal memory access"))) == "error"
    try:
        {}.get(1, 2, 3)          # a TypeError in fa4verify's own call
    except TypeError as own:
        assert be.classify(own) == "error"


def test_crash_is_an_error_with_stage_and_traceback():
    class Crash(d.TorchMathBackend):
        def forward(self, p):
            raise RuntimeError("boom")
    rec = d.run_config(Crash(), CFG, "cpu", runs=1)
    assert rec["status"] == "error" and rec["stage"] == "forward" and "boom" in rec["reason"]
    rep = d.aggregate([dict(results=[rec])], [CFG])
    assert rep["configs"][0]["status"] == "error" and d.exit_status(rep) == 1


def test_time_budget_marks_remaining_configurations_not_run():
    import time
    rec = d.run_config(d.TorchMathBackend(), CFG, "cpu", runs=1, deadline=time.monotonic() - 1)
    assert rec["status"] == "not-run"


def _fake_ok(dev, dq):
    return {"config": CFG.key(), "device": dev, "status": "ok", "inputs_digest": "i",
            "fwd_digests": {"out": "o"},
            "det": {"runs": 2, "digests": {"dq": {dq: {"count": 2, "first_run": 0}},
                                           "dk": {"k": {"count": 2, "first_run": 0}}},
                    "guard_violations": [], "unwritten": [], "buffers_not_used": []}}


def test_cross_device_difference_is_not_reproducible():
    same = d.aggregate([{"results": [_fake_ok("cuda:0", "A"), _fake_ok("cuda:1", "A")]}], [CFG])
    assert same["configs"][0]["status"] == "reproducible"
    assert same["configs"][0]["cross_device_equal"] is True
    diff = d.aggregate([{"results": [_fake_ok("cuda:0", "A"), _fake_ok("cuda:1", "B")]}], [CFG])
    c = diff["configs"][0]
    assert c["status"] == "not-reproducible" and c["cross_device_equal"] is False
    assert c["distinct_digests"] == {"dq": 2}


PER_PROCESS_BACKEND = textwrap.dedent('''
    import os
    from fa4verify import determinism as d

    class PerProcess(d.TorchMathBackend):
        """Process 0 is exact; every later process flips one bit of dv: identical within a
        process, different across processes."""
        def __init__(self):
            slot_dir = os.environ["FA4V_TEST_SLOTS"]
            self.slot = 0
            while True:
                try:
                    os.close(os.open(os.path.join(slot_dir, f"slot{self.slot}"),
                                     os.O_CREAT | os.O_EXCL))
                    break
                except FileExistsError:
                    self.slot += 1

        def backward(self, p, out, lse, *, deterministic, dq=None, dk=None, dv=None):
            g = super().backward(p, out, lse, deterministic=deterministic, dq=dq, dk=dk, dv=dv)
            if self.slot:
                g.dv.view(-1).view(__import__("torch").int16)[3] ^= 1
            return g
''')


def test_difference_only_across_fresh_processes_is_detected(tmp_path):
    (tmp_path / "perproc_backend.py").write_text(PER_PROCESS_BACKEND)
    slots = tmp_path / "slots"
    slots.mkdir()
    env = dict(os.environ, FA4V_TEST_SLOTS=str(slots),
               PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    spec = d.worker_spec("perproc_backend:PerProcess", [CFG], ["cpu"], runs=3, default_runs=0)
    recs = d.spawn_workers(spec, 2, str(tmp_path / "w"), env=env)
    assert all(r["returncode"] == 0 for r in recs), [r.get("fatal") for r in recs]
    assert len({r["pid"] for r in recs}) == 2
    # within each process all runs agree ...
    for r in recs:
        assert all(len(v) == 1 for v in r["results"][0]["det"]["digests"].values())
    # ... but the processes disagree, and the aggregate says so
    c = d.aggregate(recs, [CFG])["configs"][0]
    assert c["status"] == "not-reproducible" and c["distinct_digests"] == {"dv": 2}
    assert c["processes"] == [0, 1]


def test_fa4_backend_passes_every_feature_the_real_adapter_accepts():
    """The keywords the fa4 backend sends exist in fa4verify.kernels.adapter's signatures (so a
    feature cannot be dropped or rejected on the GPU), and buffers reach the adapter."""
    import inspect
    adapter = importlib.import_module("fa4verify.kernels.adapter")
    fwd_params = set(inspect.signature(adapter.forward).parameters)
    bwd_params = set(inspect.signature(adapter.backward).parameters)
    for cfg in d.MATRICES["cpu"]:
        p = d.make_inputs(cfg)
        assert set(backends._features(p)) | {"return_lse"} <= fwd_params
        assert set(backends._features(p)) | {"deterministic", "dq", "dk", "dv"} <= bwd_params

    ref = d.TorchMathBackend()
    seen = {}

    def fake_forward(q, k, v, **kw):
        seen["fwd"] = kw
        out, lse = ref.forward(p)
        return types.SimpleNamespace(out=out, lse=lse, config=None)

    def fake_backward(q, k, v, out, dout, lse, **kw):
        seen["bwd"] = kw
        g = ref.backward(p, out, lse, deterministic=kw["deterministic"], dq=kw["dq"],
                         dk=kw["dk"], dv=kw["dv"])
        return types.SimpleNamespace(dq=g.dq, dk=g.dk, dv=g.dv, dsink=g.dsink, config=None)

    fake_forward.__signature__ = inspect.signature(adapter.forward)
    fake_backward.__signature__ = inspect.signature(adapter.backward)

    class CpuFa4(d.Fa4Backend):
        def synchronize(self, device):
            pass

    be = object.__new__(CpuFa4)
    be.adapter = types.SimpleNamespace(forward=fake_forward, backward=fake_backward)
    cfg = d.MATRICES["cpu"][3]  # sink
    p = d.make_inputs(cfg)
    rec = d.run_config(be, cfg, "cpu", runs=2, default_runs=1)
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["det"]["buffers_not_used"] == []
    assert seen["bwd"]["learnable_sink"] is not None and seen["fwd"]["return_lse"] is True
    assert seen["bwd"]["softmax_scale"] == pytest.approx(1 / 8)
