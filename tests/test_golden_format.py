"""Golden-vector file format: lossless delta coding, provenance hash, value ordering, and the
coverage of the stratified input sample (CPU)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fa4verify.kernels import golden as G


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16])
def test_delta_coding_roundtrips_any_bits(dtype):
    rng = np.random.default_rng(0)
    a = rng.integers(0, np.iinfo(dtype).max, 10_000, dtype=np.int64).astype(dtype)
    a[:5] = [0, np.iinfo(dtype).max, 0, 1, np.iinfo(dtype).max]
    assert np.array_equal(G.delta_decode(G.delta_encode(a)), a)


def test_delta_coding_rejects_float_arrays():
    with pytest.raises(TypeError):
        G.delta_encode(np.zeros(3, np.float32))


def test_save_load_roundtrip_and_tamper_detection(tmp_path):
    x = G.golden_inputs()[:4096]
    arrays = {"x": x, "y": (x ^ np.uint32(0x55)), "h": (x >> 16).astype(np.uint16), "raw": x[:10]}
    p = G.save(tmp_path / "g", arrays, {"command": "test"}, delta=("x", "y", "h"))
    g = G.load(p)
    for k, a in arrays.items():
        assert g[k].dtype == a.dtype and np.array_equal(g[k], a), k
    meta = json.loads((tmp_path / "g.json").read_text())
    assert meta["command"] == "test" and meta["delta_coded"] == ["h", "x", "y"]
    data = bytearray(p.read_bytes())
    data[-30] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        G.load(p)


def test_sort_by_value_orders_like_float_compare():
    x = np.array([3.0, -0.0, 0.0, -np.inf, np.inf, -1e-40, 1e-40, -2.0, np.nan], np.float32)
    b = x.view(np.uint32)
    s = b[G.sort_by_value(b)].view(np.float32)
    assert np.isnan(s[-1])
    f = s[:-1]
    assert np.all(f[:-1] <= f[1:])
    assert np.signbit(f[np.flatnonzero(f == 0)[0]])   # -0 before +0


def test_golden_inputs_cover_the_edge_domain():
    x = G.golden_inputs()
    f = x.view(np.float32)
    assert 0.9e6 < x.size < 1.2e6 and x.size % 2 == 0
    assert np.unique(x).size == x.size
    with np.errstate(invalid="ignore"):
        cats = {
            "nan": np.isnan(f).sum(), "+inf": (f == np.inf).sum(), "-inf": (f == -np.inf).sum(),
            "<=-127": ((f <= -127) & np.isfinite(f)).sum(),
            "(-127,-126)": ((f > -127) & (f < -126)).sum(),
            "tiny negative (-2^-25,0)": ((f > -2.0**-25) & (f < 0)).sum(),
            "subnormal": ((np.abs(f) < 2.0**-126) & (f != 0)).sum(),
            ">127": ((f > 127) & np.isfinite(f)).sum(),
            "[-127,8]": ((f >= -127) & (f <= 8)).sum(),
        }
    for k, n in cats.items():
        assert n > 0, f"no golden input in category {k}"
    assert cats["[-127,8]"] > 500_000
    exps = np.unique((x >> 23) & 0xFF)
    assert exps.size == 256, "every binade (biased exponent 0..255) must be present"
    assert np.array_equal(G.golden_inputs(), x), "generator must be deterministic"
