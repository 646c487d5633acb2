"""P5 check: does a 'maybe' row of the sink-overflow model (within SINK_EDGE of FA4's overflow
exponent) change dK / dV / dQ / O at all? Model the band's rows as overflowed (gaps shifted +0.5)
and as finite (-0.5); compare each quantity (max |difference| / max |value|)."""
import os, pickle
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
import numpy as np
from fa4verify.fuzz import known_issues as KI, defect_models as DM
P = {o["name"]: o for o in pickle.load(open("plan0.pkl", "rb"))}
orig = KI.sink_gap
for n in ("row17", "row43", "row117", "row135", "row84"):
    p = P[n]["problem"]; a = p.materialize()
    outs = []
    for d in (+0.5, -0.5):
        KI.sink_gap = lambda pr, aa, d=d: (lambda g, k: (g + d, k))(*orig(pr, aa))
        DM.SINK_EDGE = 0.0
        outs.append(DM.sink_overflow(p, a, a["dout"] if P[n]["backward"] else None, None))
        KI.sink_gap = orig; DM.SINK_EDGE = 0.5
    m0, m1 = outs
    line = []
    for q in ("out", "lse", "dq", "dk", "dv"):
        if m0 is None or q not in m0:
            continue
        x, y = np.asarray(m0[q], np.float64), np.asarray(m1[q], np.float64)
        both = np.isfinite(x) & np.isfinite(y)
        top = np.abs(y[np.isfinite(y)]).max() if np.isfinite(y).any() else 0
        diff = np.abs(x - y)[both].max() if both.any() else 0
        line.append(f"{q}: max|diff|={diff:.3g} (max|model| {top:.3g}), elements finite in one only: {int((np.isfinite(x) != np.isfinite(y)).sum())}")
    print(n, "|", "; ".join(line))
