"""scripts/gpu_triage_mods.py without a GPU: its FA4 bug model (the SM90 backward's score_mod
indices under GQA) and every experiment line on the CPU stand-in (not evidence)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "gpu_triage_mods.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_triage_mods", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _case(h, hk, pair="rel_bias"):
    from fa4verify.judge.attention import oracle_backward
    s = _script()
    p = s._problem((pair,), nheads=h, nheads_kv=hk, small=True)
    a = p.materialize()
    return s, p, a, oracle_backward(p, a)


def test_bug_model_is_the_oracle_without_gqa_and_differs_with_it():
    """g = 1: FA4's index map is the identity, the model must be the exact gradient; g > 1 with a
    q_idx-dependent pair: the model must differ (else the GPU line could not tell the causes apart)."""
    s, p, a, r = _case(2, 2)
    m = s.bug_model(p, a, r.out, r.lse)
    for n in ("dq", "dk", "dv"):
        np.testing.assert_allclose(m[n], getattr(r, n), rtol=0, atol=1e-12 * np.abs(getattr(r, n)).max())
    s, p, a, r = _case(4, 2)
    m = s.bug_model(p, a, r.out, r.lse)
    assert s.rel(m["dq"], r.dq) > 0.05 and s.rel(m["dk"], r.dk) > 0.05
    s, p, a, r = _case(4, 2, "softcap")       # index-free: FA4's wrong indices change nothing
    m = s.bug_model(p, a, r.out, r.lse)
    assert s.rel(m["dq"], r.dq) < 1e-12


def test_bug_model_marks_an_out_of_range_head_nan():
    from fa4verify import mods
    s, p, a, r = _case(4, 2, "alibi")
    # fa4verify's aux covers every head FA4's mapping reaches (Note [Aux for the mapped heads])
    assert np.isfinite(s.bug_model(p, a, r.out, r.lse)["dq"]).all()
    # a caller's 4 slopes: heads 2, 3 map to 4..7, past them
    pair = p.mod_pairs()[0]
    a = dict(a, mod_aux={"alibi": pair.make_aux(mods.ModShape(p.batch, 4, p.seqlen_q, p.seqlen_k), seed=p.mod_seed)})
    m = s.bug_model(p, a, r.out, r.lse)
    assert np.isnan(m["dq"][:, :, 2:]).all() and np.isfinite(m["dq"][:, :, :2]).all()


def test_every_experiment_line_runs_on_the_cpu_stand_in(capsys):
    s = _script()
    assert s.main(["--device", "cpu", "--only", "score", "--only", "mask"]) == 0
    out = capsys.readouterr().out
    assert "CPU stand-in (not evidence)" in out
    lines = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 9 + 11, out
    assert not any("ERROR" in ln for ln in lines), out
    # the stand-in is the reference rounded: small against it, the old reference far off with outliers
    assert all("rel_err_vs_ref" in ln for ln in lines)


@pytest.mark.parametrize("rows", ["4,999", "x", ""])
def test_bad_rows_are_refused_with_exit_2(rows, capsys):
    assert _script().main(["--device", "cpu", "--only", "rows", "--rows", rows]) == 2
    assert "--rows takes" in capsys.readouterr().err
