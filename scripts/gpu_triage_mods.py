"""Isolate the two classes of unexplained mod-pair violations of the SM90 coverage plan on
production FA4 (flash-attn-4 4.0.0b36, H200), one line per experiment with the max relative error
``max|got - ref| / max|ref|`` against the float64 reference:

* **score_mod + GQA/MQA, backward** (plan rows 4, 10, 58, 63, 64). Predicted from source: FA4's
  SM90 backward never packs GQA (``interface.py:2576-2577`` forces ``pack_gqa = False``; the
  kernel indexes Q, LSE, dO by the query head, ``flash_bwd_sm90.py:906-912``), yet its
  ``apply_score_mod`` / ``apply_score_mod_bwd`` pass ``qhead_per_kvhead=self.qhead_per_kvhead``
  (``flash_bwd_sm90.py:1064, 1108``) to ``softmax.apply_score_mod_inner`` / ``_bwd_inner``, which
  treat it as the Pack-GQA factor: the score_mod sees ``q_idx // g`` and head ``h * g + q_idx % g``
  (``softmax.py:594-599, 618``). The forward (``flash_fwd_sm90.py:1528``) and the SM100 backward
  (``flash_bwd_sm100.py:3211, 3243``) pass ``... if pack_gqa else 1``. :func:`bug_model` is that
  backward in float64: where FA4 is wrong it should equal FA4 to bf16 accuracy.
* **mask_mod pairs with softcap / sink, forward** (rows 5, 33, 39, 62, 72, 98, 100): fa4verify's
  mod oracle dropped the problem's softcap and learnable sink (fixed in ea5ac61, Note [Mods with
  softcap and sink]); FA4 is expected right against the corrected reference and far from the
  old one ("ref_no_softcap_sink").

Run on the H200, one group per command (each a few minutes, mostly compiles; the groups are
independent): ``python scripts/gpu_triage_mods.py --only score``, ``--only mask``, ``--only rows``.
``--device cpu`` replaces FA4 by a stand-in (the float64 reference rounded to bf16) at small sizes
so ``tests/test_gpu_triage_mods_script.py`` runs every line without a GPU: not evidence.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any, Optional

import numpy as np

#: the plan rows of the H200 triage (coverage.production, space_for("sm90", "bf16"), plan(seed=0)):
#: index -> the row, rebuilt with coverage.cases.problem_for(space, row, index, seed=0)
ROWS: dict[int, dict[str, str]] = {
    4: {"det": "off", "form": "score_mod", "values": "edges", "softcap": "off", "mask": "causal_left",
        "seqlen": "tile_p1", "gqa": "mqa", "hd": "104", "sink": "off"},
    10: {"det": "on", "form": "score_mod", "values": "negative_scores", "gqa": "mqa", "hd": "200", "softcap": "off",
         "sink": "off", "seqlen": "eq_tile", "mask": "left"},
    58: {"form": "score_mod", "gqa": "2", "softcap": "off", "mask": "none", "hd": "96", "values": "peaked_rescale",
         "det": "off", "sink": "off", "seqlen": "q_lt_k"},
    63: {"form": "score_mod", "hd": "256", "sink": "off", "seqlen": "multi", "values": "edges", "mask": "both",
         "gqa": "2", "det": "off", "softcap": "off"},
    64: {"form": "score_mod", "hd": "136", "seqlen": "q_gt_k", "values": "tiny", "mask": "causal_left",
         "softcap": "off", "gqa": "mqa", "sink": "off", "det": "on"},
    5: {"det": "off", "form": "mask_mod", "softcap": "off", "gqa": "4", "sink": "on", "mask": "none",
        "seqlen": "q_lt_k", "hd": "200", "values": "normal"},
    33: {"form": "mask_mod", "gqa": "1", "values": "outliers", "hd": "104", "seqlen": "tile_m1", "mask": "none",
         "sink": "on", "det": "off", "softcap": "on"},
    39: {"form": "mask_mod", "hd": "192x128", "mask": "none", "det": "on", "seqlen": "lt_tile", "values": "tiny",
         "gqa": "4", "softcap": "on", "sink": "on"},
    62: {"form": "mask_mod", "hd": "72", "gqa": "4", "softcap": "on", "values": "normal", "det": "off",
         "seqlen": "tile_m1", "sink": "on", "mask": "none"},
    72: {"form": "mask_mod", "hd": "96", "values": "normal", "sink": "off", "det": "on", "seqlen": "eq_tile",
         "softcap": "on", "mask": "none", "gqa": "2"},
    98: {"hd": "8", "seqlen": "q_gt_k", "gqa": "4", "values": "tiny", "form": "mask_mod", "mask": "none",
         "sink": "on", "softcap": "off", "det": "on"},
    100: {"hd": "96", "seqlen": "q_gt_k", "sink": "on", "gqa": "4", "form": "mask_mod", "mask": "none",
          "det": "off", "softcap": "on", "values": "peaked_rescale"},
}


def rel(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    den = float(np.max(np.abs(ref))) if ref.size else 0.0
    with np.errstate(invalid="ignore"):
        err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    return err / den if den > 0 else err


# ---------------------------------------------------------------------------------------------
# the predicted FA4 SM90 backward of a score pair under GQA (float64)
# ---------------------------------------------------------------------------------------------

def bug_model(problem, a: dict, out, lse) -> dict[str, np.ndarray]:
    """dQ, dK, dV of FA4's SM90 backward as predicted from source: the product's model of known
    issue ``sm90_score_mod_gqa_bwd_indices``
    (:func:`fa4verify.fuzz.defect_models.score_mod_gqa_indices`: the score pair at head
    ``h * g + q % g``, q_idx ``q // g`` in the backward, the forward's right LSE and O; NaN where a
    mapped head lies past the aux tensor). ``out`` / ``lse``: unused (the model computes them)."""
    from fa4verify.fuzz.defect_models import score_mod_gqa_indices
    return score_mod_gqa_indices(problem, a, a["dout"], None)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------

class Fa4:
    where = "GPU"

    def __init__(self):
        from fa4verify.kernels import adapter
        from fa4verify.kernels.device import local_gpu, where_measured
        self.ad = adapter
        self.where = where_measured(local_gpu())

    def run(self, problem, a, *, builtin: Optional[dict] = None, pack_gqa=None, deterministic=False,
            expand_kv: bool = False) -> dict[str, np.ndarray]:
        """FA4's O, LSE, dQ, dK, dV for ``problem`` on arrays ``a`` (``builtin``: call FA4's own
        causal/window/softcap instead of the pair; ``expand_kv``: K/V repeated to every query
        head, dK/dV summed back over each group)."""
        import torch
        from fa4verify import mods
        t = lambda x: torch.from_numpy(np.ascontiguousarray(x, np.float32)).cuda().to(torch.bfloat16)  # noqa: E731
        g = problem.nheads // problem.nheads_kv
        k, v = a["k"], a["v"]
        if expand_kv:
            k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
        q_, k_, v_, do_ = t(a["q"]), t(k), t(v), t(a["dout"])
        kw: dict[str, Any] = dict(softmax_scale=problem.softmax_scale, softcap=float(problem.softcap),
                                  learnable_sink=(torch.from_numpy(np.asarray(a["learnable_sink"], np.float32)).cuda()
                                                  if problem.sink else None))
        if builtin is not None:
            kw.update(builtin)
        else:
            kw.update(causal=problem.causal, window_size=tuple(problem.window_size))
            for pair in problem.mod_pairs():
                if pair is not None:
                    aux_v = mods.aux_for(problem, pair, a)
                    aux = [torch.from_numpy(np.asarray(x)).cuda() for x in aux_v]
                    kw.update(pair.kw_fa4(aux, aux_v.scalars, aux_v.constants))
        fkw = {n: x for n, x in kw.items() if n != "score_mod_bwd"}
        f = self.ad.forward(q_, k_, v_, return_lse=True, pack_gqa=pack_gqa, **fkw)
        r = self.ad.backward(q_, k_, v_, f.out, do_, f.lse, deterministic=deterministic, **kw)
        torch.cuda.synchronize()
        n = lambda x: x.float().cpu().numpy().astype(np.float64)  # noqa: E731
        dk, dv = n(r.dk), n(r.dv)
        if expand_kv:
            s = dk.shape
            dk = dk.reshape(s[0], s[1], problem.nheads_kv, g, s[3]).sum(axis=3)
            dv = dv.reshape(s[0], s[1], problem.nheads_kv, g, dv.shape[3]).sum(axis=3)
        return {"out": n(f.out), "lse": n(f.lse), "dq": n(r.dq), "dk": dk, "dv": dv}


class CpuStandIn:
    """Same surface as :class:`Fa4`: the float64 reference rounded to bf16 (not evidence)."""
    where = "CPU stand-in (not evidence)"

    def run(self, problem, a, *, builtin=None, pack_gqa=None, deterministic=False, expand_kv=False):
        import ml_dtypes
        from fa4verify.judge.attention import oracle_backward
        p = problem if builtin is None else problem.replace(mods=(), **builtin)
        r = oracle_backward(p, a)
        bf = lambda x: np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
        return {"out": bf(r.out), "lse": np.asarray(r.lse, np.float32).astype(np.float64), "dq": bf(r.dq),
                "dk": bf(r.dk), "dv": bf(r.dv)}


# ---------------------------------------------------------------------------------------------
# experiments
# ---------------------------------------------------------------------------------------------

def _problem(mods_, *, nheads, nheads_kv, seqlen=256, head_dim=128, small=False, **kw):
    from fa4verify.problem import ValueSpec
    from fa4verify.problem import AttentionProblem
    if small:
        seqlen, head_dim = min(seqlen, 48), min(head_dim, 32)
    return AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=seqlen, seqlen_k=seqlen, nheads=nheads,
                            nheads_kv=nheads_kv, head_dim=head_dim, head_dim_v=head_dim, mods=tuple(mods_),
                            values=kw.pop("values", ValueSpec("normal", 5)), **kw)


def _refs(problem, a, *, old_semantics=False):
    from fa4verify.judge.attention import oracle_backward
    p = problem.replace(softcap=0.0, sink=False) if old_semantics else problem
    r = oracle_backward(p, a)
    return {"out": r.out, "lse": r.lse, "dq": r.dq, "dk": r.dk, "dv": r.dv}


def _line(name: str, got: dict, ref: dict, names=("out", "lse", "dq", "dk", "dv"), extra: Optional[dict] = None,
          expect: str = "") -> str:
    parts = [f"{n}={rel(got[n], ref[n]):.2e}" for n in names]
    if extra:
        for label, other in extra.items():
            parts.append(f"| vs {label}: " + " ".join(f"{n}={rel(got[n], other[n]):.2e}" for n in other))
    return f"{name:52s} rel_err_vs_ref " + " ".join(parts) + (f"   [expect: {expect}]" if expect else "")


def score_experiments(K, small: bool):
    """Score pairs: MHA vs GQA vs MQA, K/V expanded, an index-free pair, pack_gqa in the forward,
    deterministic; each GQA backward also against :func:`bug_model`."""
    exps = []
    for label, mods_, h, hk, kw, expect in (
            ("rel_bias MHA 4/4", ("rel_bias",), 4, 4, {}, "all ~4e-3 (no GQA: right)"),
            ("rel_bias GQA 4/2", ("rel_bias",), 4, 2, {}, "fwd ok; dq/dk wrong; = bug_model"),
            ("rel_bias MQA 3/1", ("rel_bias",), 3, 1, {}, "fwd ok; dq/dk wrong; = bug_model"),
            ("rel_bias GQA 4/2 causal", ("rel_bias",), 4, 2, {"causal": True}, "fwd ok; dq/dk wrong; = bug_model"),
            ("softcap pair GQA 4/2 (index-free mod)", ("softcap",), 4, 2, {}, "all ok (control)"),
            ("alibi GQA 4/2, slopes padded to H*g", ("alibi",), 4, 2, {"pad": True},
             "fwd ok; dq/dk wrong; = bug_model"),
    ):
        pad = kw.pop("pad", False)
        p = _problem(mods_, nheads=h, nheads_kv=hk, small=small, **kw)
        a = p.materialize()
        if pad:       # FA4's backward reads slopes[h*g + q%g]: give it defined entries past nheads
            g = h // hk
            a = dict(a, mod_aux={"alibi": [np.asarray([2.0 ** (-8.0 * (i + 1) / h) for i in range(h * g)],
                                                      np.float32)]})
        exps.append((label, p, a, {}, expect))
    p = _problem(("rel_bias",), nheads=4, nheads_kv=2, small=small)
    a = p.materialize()
    exps.append(("rel_bias GQA 4/2, K/V expanded to 4 heads", p, a, {"expand_kv": True},
                 "all ok (workaround: no GQA in the kernel)"))
    exps.append(("rel_bias GQA 4/2 fwd pack_gqa=False", p, a, {"pack_gqa": False}, "fwd ok; bwd = bug_model"))
    exps.append(("rel_bias GQA 4/2 deterministic bwd", p, a, {"deterministic": True}, "fwd ok; bwd = bug_model"))
    for label, p, a, kw, expect in exps:
        try:
            got = K.run(p, a, **kw)
            ref = _refs(p, a)
            extra = None
            if p.nheads_kv < p.nheads and not kw.get("expand_kv"):
                extra = {"bug_model": bug_model(p, a, ref["out"], ref["lse"])}
            yield _line(label, got, ref, extra=extra, expect=expect)
        except Exception as e:  # noqa: BLE001 - one experiment failing is a result, the rest still run
            yield f"{label:52s} ERROR {type(e).__name__}: {str(e)[:300]}"


def mask_experiments(K, small: bool):
    """Mask pairs with softcap / sink under GQA: FA4 against the reference with and without them
    (the old oracle), and the built-in mask the pair equals."""
    from fa4verify.problem import ValueSpec
    first = True
    for label, pair, builtin, kw, expect in (
            ("causal mod GQA 8/2 softcap sink", "causal", {"causal": True}, dict(softcap=30.0, sink=True),
             "out/lse small vs ref, large vs ref_no_softcap_sink; bwd ~4e-3 (never measured before)"),
            ("causal mod GQA 8/2 softcap", "causal", {"causal": True}, dict(softcap=30.0), "small vs ref"),
            ("causal mod GQA 8/2 sink", "causal", {"causal": True}, dict(sink=True), "small vs ref"),
            ("causal mod MHA 2/2 softcap sink", "causal", {"causal": True}, dict(softcap=30.0, sink=True),
             "small vs ref"),
            ("sliding_window mod GQA 8/2 sink", "sliding_window", {"window_size": (128, 0)}, dict(sink=True),
             "small vs ref"),
    ):
        h, hk = (2, 2) if "MHA" in label else (8, 2)
        p = _problem((pair,), nheads=h, nheads_kv=hk, small=small, values=ValueSpec("outliers", 9), **kw)
        a = p.materialize()
        variants = [("", {}), (" [FA4 built-in mask]", {"builtin": dict(builtin)})]
        if first:
            variants.append((" [fwd pack_gqa=False]", {"pack_gqa": False}))
            first = False
        for sub, run_kw in variants:
            try:
                got = K.run(p, a, **run_kw)
                ref = _refs(p, a)
                old = _refs(p, a, old_semantics=True)
                yield _line(label + sub, got, ref,
                            extra={"ref_no_softcap_sink": {"out": old["out"]}}, expect=expect)
            except Exception as e:  # noqa: BLE001
                yield f"{label + sub:52s} ERROR {type(e).__name__}: {str(e)[:300]}"


def row_experiments(target, rows):
    """The triage's plan rows again through coverage.production's own judging."""
    from fa4verify.checks.coverage import PLAN_PROPERTIES
    from fa4verify.coverage import cases, space
    from fa4verify.fuzz.known_issues import match_known_issue
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.fuzz.violation import Violation
    from fa4verify.errors import Unsupported
    sp = space.space_for("sm90", "bf16")
    for i in rows:
        r = ROWS[i]
        p = cases.problem_for(sp, r, i, seed=0)
        try:
            check_problem(p, target, properties=PLAN_PROPERTIES, deterministic=r["det"] == "on")
            yield f"row {i:3d} ok           {p.describe()}"
        except Unsupported as e:
            yield f"row {i:3d} unsupported  {p.describe()}: {str(e)[:120]}"
        except Violation as v:
            ki = match_known_issue(p, v, target="production")
            yield (f"row {i:3d} VIOLATION {v.prop} {v.metrics.get('quantity', '')} known={ki.name if ki else None} "
                   f"{p.describe()}: {v.message[:160]}")
        except Exception as e:  # noqa: BLE001
            yield f"row {i:3d} ERROR {type(e).__name__}: {str(e)[:200]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--only", choices=("score", "mask", "rows"), action="append",
                    help="run only these groups (default: all)")
    ap.add_argument("--rows", default=",".join(str(i) for i in sorted(ROWS)),
                    help="comma-separated plan rows for the 'rows' group (default: all of ROWS)")
    ns = ap.parse_args(argv)
    try:
        rows = [int(x) for x in ns.rows.split(",") if x.strip()]
    except ValueError:
        rows = None
    if not rows or any(i not in ROWS for i in rows):
        print(f"gpu_triage_mods: --rows takes a comma-separated subset of {sorted(ROWS)}", file=sys.stderr)
        return 2
    small = ns.device == "cpu"
    try:
        K = Fa4() if ns.device == "cuda" else CpuStandIn()
    except Exception as e:  # noqa: BLE001
        print(f"gpu_triage_mods: cannot start FA4: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    groups = ns.only or ["score", "mask", "rows"]
    print(f"# gpu_triage_mods on {K.where}; rel_err = max|got - ref| / max|ref|, ref = float64 oracle", flush=True)
    if "score" in groups:
        print("## score_mod pairs, GQA backward (rows 4, 10, 58, 63, 64)", flush=True)
        for line in score_experiments(K, small):
            print(line, flush=True)
    if "mask" in groups:
        print("## mask_mod pairs with softcap / sink (rows 5, 33, 39, 62, 72, 98, 100)", flush=True)
        for line in mask_experiments(K, small):
            print(line, flush=True)
    if "rows" in groups and ns.device == "cuda":
        print("## the plan rows through coverage.production's judging (mask rows expected ok after ea5ac61; "
              "score rows expected to stay violations: FA4)", flush=True)
        from fa4verify.targets import ProductionTarget
        try:
            for line in row_experiments(ProductionTarget(), rows):
                print(line, flush=True)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
