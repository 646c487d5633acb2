"""The device sweep of FA4's exp2 device functions (``fa4verify exp2 --device cuda``), on CPU:
the device twin is bit-exact to the CPU twin, the sweep finds and reports a device function that
differs from the twin, its on-device oracle agrees with the CPU certification, the command refuses
``--device cuda`` without a GPU in one line, and the packed probe (renamed) compiles for sm_100a
and sm_103a (compile-only)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fa4verify.oracles import binary32 as b32  # noqa: E402
from fa4verify.exp2 import device as ed  # noqa: E402
from fa4verify.kernels.device import GPU  # noqa: E402
from fa4verify.kernels.twin import ex2_emulation  # noqa: E402
from fa4verify.kernels.twin_torch import ex2_emulation_torch  # noqa: E402

H200 = GPU("NVIDIA H200", 9, 0)


def _inputs(n: int = 1 << 17, seed: int = 0) -> np.ndarray:
    """Random bit patterns below 2^22 plus every class of input of Note [exp2 emulation]."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[~(x >= ed.FLT_MAX) & ~(x >= 2.0**22)]                      # drop +inf, >= 2^22 (not NaN)
    o = rng.integers(b32.f32_range(-127.0, 8.0)[0], b32.f32_range(-127.0, 8.0)[1], size=n)
    special = [np.nan, -np.inf, -127.0, -126.5, -126.0, -2.0**-25, -1e-30, -2.0**-126, -2.0**-149,
               -0.0, 0.0, 2.0**-149, 2.0**-126, 0.5, 1.0, 7.999999, 127.5, 128.0, 129.5, 4.0e6]
    nan_bits = np.array(ed.EDGE_NAN_BITS, dtype=np.uint32).view(np.float32)
    sub = (rng.integers(1, 2**23, size=4096) | 0x80000000).astype(np.uint32).view(np.float32)
    return np.concatenate([x, ed._f32_from_ordered_torch(torch.from_numpy(o)).numpy(),
                           np.float32(special), nan_bits, sub]).astype(np.float32)


@pytest.mark.parametrize("variant", ["packed", "scalar"])
@pytest.mark.parametrize("degree", [1, 3, 5])
def test_device_twin_bitwise_equals_cpu_twin(variant, degree):
    x = _inputs()
    want = ex2_emulation(x, degree, variant).view(np.uint32)
    got = ex2_emulation_torch(torch.from_numpy(x), degree, variant).numpy().view(np.uint32)
    bad = np.flatnonzero(want != got)
    assert bad.size == 0, (f"{bad.size} of {x.size} differ, e.g. x={x[bad[:3]]!r} "
                           f"cpu={want[bad[:3]]} torch={got[bad[:3]]}")


def test_device_twin_refuses_inputs_outside_its_domain():
    with pytest.raises(ValueError, match="2\\^22"):
        ex2_emulation_torch(torch.tensor([1.0, float("inf")]), 3)


def test_generated_inputs_are_every_fp32_of_the_range_in_order():
    olo, ohi = b32.f32_range(-2.0**-148, 2.0**-148)
    xs = torch.cat(list(ed._chunks([(olo, ohi)], 3, "cpu"))).numpy()
    assert [int(v) for v in b32.ordered(xs)] == list(range(olo, ohi + 1))
    main, edge = ed.emulation_ranges(-127.0, 8.0)
    assert main == [b32.f32_range(-127.0, 8.0)]
    assert edge[0] == (int(b32.ordered(np.float32(-ed.FLT_MAX))), main[0][0] - 1)
    assert edge[1] == (main[0][1] + 1, int(b32.ordered(np.float32(2.0**22))) - 1)


def _wrong_device_fn(x):
    """A stand-in device function that differs from the twin by one ulp on (0.5, 0.5001)."""
    y = ex2_emulation_torch(x, 3, "scalar", check_domain=False).clone()
    m = (x > 0.5) & (x < 0.5001)
    y[m] = torch.nextafter(y[m], torch.tensor(10.0))
    return y


def _run(fns, lo=0.49995, hi=0.50005, **kw):
    edge = [(int(b32.ordered(np.float32(-127.01))), int(b32.ordered(np.float32(-127.0))) - 1)]
    return ed.run_device([3], lo, hi, gpu=H200, chunk=1 << 12, fns=fns, device="cpu",
                         where="CPU stand-in", edge_spans=edge, **kw)


def test_device_sweep_finds_a_device_function_that_differs_from_the_twin():
    sec = _run({("ex2_emulation", 3): _wrong_device_fn}, mufu=False)
    s, = sec["sweeps"]
    _, ohi = b32.f32_range(0.49995, 0.50005)
    expect = ohi - int(b32.ordered(np.float32(0.5)))
    assert s["mismatches"] == expect > 0
    assert s["examples"][0]["x_bits"] == "0x3f000001"
    ex = s["examples"][0]
    assert int(ex["device_bits"], 16) == int(ex["twin_bits"], 16) + 1
    assert sec["violations"] and "device != twin" in sec["violations"][0]


def test_device_sweep_of_the_twin_itself_has_no_mismatch_and_covers_range_edge_and_nans():
    fn = functools.partial(ex2_emulation_torch, degree=3, variant="scalar")
    sec = _run({("ex2_emulation", 3): fn}, mufu=False)
    s, = sec["sweeps"]
    olo, ohi = b32.f32_range(0.49995, 0.50005)
    ea, eb = sec["edge_spans_ordered"][0]
    assert s["mismatches"] == 0 and not sec["violations"]
    assert s["n_inputs"] == (ohi - olo + 1) + (eb - ea + 1) + len(ed.EDGE_NAN_BITS) + 1


def test_device_scores_equal_the_cpu_certification_of_the_same_range():
    from fa4verify.exp2 import cert as ec
    lo, hi = -0.50002, -0.49998               # (R1)/(R2) boundary: rounded and exact fractions
    fn = functools.partial(ex2_emulation_torch, degree=3, variant="packed")
    sec = _run({("ex2_emulation", 3): fn, ("mufu_ex2", None): torch.exp2}, lo=lo, hi=hi)
    cpu = ec.sweep(3, lo, hi, method="direct").stats
    dev = sec["sweeps"][0]["scored"]["main"]
    assert dev["n"] == cpu.n
    assert dev["max_ulp_fp32"] == cpu.max_ulp32 and dev["argmax"] == cpu.argmax_ulp32
    assert ed.cross_check(sec, {"3": {"n_inputs": cpu.n, "max_ulp_fp32": cpu.max_ulp32}}) == []
    assert ed.cross_check(sec, {"3": {"n_inputs": cpu.n, "max_ulp_fp32": cpu.max_ulp32 + 1}})
    m = sec["mufu"]
    assert m["mismatches"] is None and set(m["scored"]) == {"neg"}
    # torch's fp32 exp2 on the CPU as the stand-in: scored like any device function
    x = ed._f32_from_ordered_torch(torch.arange(*b32.f32_range(lo, hi)))
    assert m["scored"]["neg"]["n"] == x.numel() + 1


def test_device_cuda_without_a_gpu_is_a_one_line_usage_error(monkeypatch):
    from click.testing import CliRunner
    from fa4verify.cli import cli
    from fa4verify.kernels import device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device.local_gpu.cache_clear()
    try:
        r = CliRunner().invoke(cli, ["exp2", "--device", "cuda", "--degree", "3"], prog_name="fa4verify")
    finally:
        device.local_gpu.cache_clear()
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines == ["fa4verify exp2: error: --device cuda: no CUDA GPU here (torch.cuda.is_available() is False)"]


def test_device_report_through_the_command_on_a_stand_in(monkeypatch, tmp_path):
    """The ``--device cuda`` code path of the command (what scripts/gpu/exp2_device.sh runs), with
    the GPU replaced by CPU stand-ins: JSON has the device section and a mismatch exits 1."""
    import json
    from click.testing import CliRunner
    from fa4verify.cli import cli, exp2 as cli_exp2
    monkeypatch.setattr(cli_exp2, "_device_gpu", lambda: H200)
    edge = [(int(b32.ordered(np.float32(-127.001))), int(b32.ordered(np.float32(-127.0))) - 1)]
    real = ed.run_device

    def run(degrees, lo, hi, **kw):
        kw.update(chunk=1 << 12, device="cpu", where="CPU stand-in", edge_spans=edge,
                  fns={("ex2_emulation", 3): _wrong_device_fn, ("mufu_ex2", None): torch.exp2})
        return real(degrees, lo, hi, **kw)

    monkeypatch.setattr(ed, "run_device", run)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["exp2", "--device", "cuda", "--degree", "3", "--range", "0.49999:0.50002",
                                 "--jobs", "1", "--json", str(out)], prog_name="fa4verify", catch_exceptions=False)
    assert r.exit_code == 1, r.output
    rep = json.loads(out.read_text())
    assert rep["device"]["where"] == "CPU stand-in"
    assert rep["device"]["sweeps"][0]["mismatches"] > 0
    assert any("device != twin" in v for v in rep["verdict"]["violations"])
    assert "device sweep [CPU stand-in]" in r.output


def test_old_packed_probe_key_names_the_renamed_module():
    from fa4verify.kernels.probes import probe_base as pb
    assert pb.PROBES["ex2_emulation_2"] == pb.PROBES["ex2_emulation_packed"]


@pytest.mark.fa4
def test_old_packed_probe_name_is_a_shim_of_the_renamed_module():
    from fa4verify.kernels.probes import probe_base as pb
    old = pb.load("ex2_emulation_2")
    new = pb.load("ex2_emulation_packed")
    assert new.__name__.endswith("probe_ex2_emulation_packed")
    assert old is new and new.MIRRORS == "flash_attn/cute/utils.py::ex2_emulation_2"
    from fa4verify.kernels.probes import probe_ex2_emulation_2 as shim
    assert shim.run is new.run and shim.compile_only is new.compile_only


@pytest.mark.slow
@pytest.mark.fa4
@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
def test_packed_probe_compiles_for_sm100_family_with_packed_ffma2(arch, tmp_path):
    from fa4verify.kernels.probes import probe_base as pb
    a = pb.compile_in_subprocess("ex2_emulation_packed", "3", arch, tmp_path)
    assert "fma.rn.f32x2" in a.ptx and "add.rm.f32x2" in a.ptx


def test_probe_functions_pad_every_call_to_one_compiled_size(monkeypatch):
    """Each probe compiles once per variant: the device sweep pads the last chunk, the edge spans
    and the special inputs to a multiple of the probe chunk (no compile per odd size)."""
    from fa4verify.kernels.probes import probe_base as pb
    seen = []

    class FakeProbe:
        @staticmethod
        def run(x, variant="3"):
            seen.append(int(x.numel()))
            return ex2_emulation_torch(x, int(variant), "scalar")

    monkeypatch.setattr(pb, "load", lambda key: FakeProbe)
    monkeypatch.setattr(pb, "DEFAULT_CHUNK", 1 << 10)
    fn = ed._probe_fn("ex2_emulation", "3")
    x = torch.linspace(-3, 3, 9).to(torch.float32)
    assert torch.equal(fn(x).view(torch.int32), ex2_emulation_torch(x, 3, "scalar").view(torch.int32))
    assert seen == [1 << 10]
    fn(torch.zeros(3 << 10, dtype=torch.float32))
    assert seen[-1] == 3 << 10
