"""benchmarks/fuzz_sibling_kernels.py on synthetic reports: a sibling that ran only its group's
kernels passes, one kernel more is listed (exit 1), a report whose draw differs is refused (2)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from fa4verify._strategies.problem import sibling_key

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("fsk", ROOT / "benchmarks" / "fuzz_sibling_kernels.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _report(tmp_path, mutate=None):
    from fa4verify.fuzz import drawn
    from fa4verify.targets import production_features
    feats = production_features()
    ps = drawn.draw_problems(arch="sm90", dtype="bf16", examples=12, seed=3, profile="ci", features=feats,
                             limits={"max_head_dim": 256, "head_dim_choices": [8, 64]}, siblings=1)
    m = _script()
    kernels, first = {}, {}
    for i, p in enumerate(ps):
        base = first.setdefault(sibling_key(p), i)
        kernels[str(i)] = [f"_flash_attn_fwd:{base:04d}"]
    det = {"example_kernels": kernels, "features_drawn_from": list(feats), "head_dims_drawn_from": [8, 64],
           "siblings": 1, "examples_drawn": len(ps),
           "draw_digest": hashlib.sha256("".join(p.digest() for p in ps).encode()).hexdigest()[:16]}
    if mutate:
        mutate(det, ps, m)
    rep = {"config": {"archs": ["sm90"], "profile": "default", "seed": 3, "dtype": "bf16"},
           "results": [{"id": "fuzz.production", "where": "test", "details": det}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(rep))
    return str(f), ps


def test_siblings_on_their_groups_kernels_pass(tmp_path, capsys):
    f, ps = _report(tmp_path)
    assert _script().main([f]) == 0
    assert "siblings" in capsys.readouterr().out


def test_a_sibling_with_a_kernel_of_its_own_is_listed(tmp_path, capsys):
    def extra(det, ps, m):
        j = next(i for i in range(1, len(ps)) if sibling_key(ps[i]) == sibling_key(ps[i - 1]))
        det["example_kernels"][str(j)].append("_flash_attn_bwd:beef")
    f, _ = _report(tmp_path, extra)
    assert _script().main([f]) == 1
    assert "_flash_attn_bwd:beef" in capsys.readouterr().out


def test_a_sibling_without_a_record_is_no_evidence(tmp_path, capsys):
    def drop(det, ps, m):
        j = next(i for i in range(1, len(ps)) if sibling_key(ps[i]) == sibling_key(ps[i - 1]))
        del det["example_kernels"][str(j)]
    f, _ = _report(tmp_path, drop)
    assert _script().main([f]) == 1
    assert "1 without a record" in capsys.readouterr().out


def test_a_report_of_another_draw_or_no_kernels_is_refused(tmp_path, capsys):
    f, _ = _report(tmp_path, lambda det, ps, m: det.update(draw_digest="0" * 16))
    assert _script().main([f]) == 2
    g = tmp_path / "empty.json"
    g.write_text(json.dumps({"results": []}))
    assert _script().main([str(g)]) == 2
    assert _script().main([]) == 2
