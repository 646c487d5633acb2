"""Observation: where the score-index model's slack (2^-7 x the tensor's largest |model|) exceeds an
element's own magnitude, a fault that zeroes the element stays 'within the model'. Share of finite
model elements with |model| <= slack: global (as judged today) and with a per-row slack (2^-7 x
the largest |model| of the element's (token, head) row)."""
import os, pickle
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
import numpy as np
import absorb17 as A
from fa4verify.fuzz import defect_models as DM
by = {o["name"]: o for o in A.P}
for n in ("row111", "row2", "edge:score_head_gqa", "row114", "row104", "row18", "row116", "row103", "edge:score_unpacked_gqa"):
    p = by[n]["problem"]; a = p.materialize()
    cache = {}
    line = []
    for q in ("dq", "dk", "dv"):
        kind, ref = A.model_ref("sm90_score_mod_gqa_bwd_indices", p, a, q, cache)
        fin = np.isfinite(ref)
        if not fin.any():
            line.append(f"{q}: all NaN"); continue
        top = np.abs(ref[fin]).max()
        g = np.mean(np.abs(ref[fin]) <= DM.MODEL_SLACK * top)
        with np.errstate(invalid="ignore"):
            rowmax = np.nanmax(np.abs(ref), axis=-1, keepdims=True)
        r = np.mean((np.abs(ref) <= DM.MODEL_SLACK * rowmax)[fin])
        line.append(f"{q}: global {g:.0%} per-row {r:.0%} (max|model| {top:.3g}, median {np.median(np.abs(ref[fin])):.3g})")
    print(f"{n:24s} {p.describe()[:70]:70s} | " + "; ".join(line))
