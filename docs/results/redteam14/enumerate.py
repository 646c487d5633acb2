"""FA4's own SM100 variants over fa4verify's sm100 bf16 space: every (form, hd, mask, gqa, det,
seqlen) combination the space allows (pairwise why_not, as coverage/variants.py filters), as a
small call from fa4verify's problem_for, keyed by sm100_variants (FA4's host code builds the kernel
objects; nothing traced). Forms from argv (default dense block_sparse). Writes enum_<forms>.pkl:
list of (row, problem, backward, det, fwd_key, bwd_key, error)."""
import os, sys, pickle, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa4verify.compile.production import enter_fake_device
enter_fake_device("b200")
import sm100_variants as V
from fa4verify.coverage.space import space_for
from fa4verify.coverage.cases import problem_for
forms = sys.argv[1:] or ["dense", "block_sparse"]
sp = space_for("sm100", "bf16")
BASE = {"softcap": "off", "sink": "off", "values": "normal", "scale": "default"}
dims = ("form", "hd", "mask", "gqa", "det", "seqlen")
out = []
t0 = time.time()
i = 0
for form in forms:
    for hd in sp.values["hd"]:
        for mask in sp.values["mask"]:
            for gqa in sp.values["gqa"]:
                for det in sp.values["det"]:
                    for sl in sp.values["seqlen"]:
                        row = {**BASE, "form": form, "hd": hd, "mask": mask, "gqa": gqa, "det": det, "seqlen": sl}
                        if any(sp.why_not({a: row[a], b: row[b]}) is not None for a in dims for b in dims if a < b):
                            continue
                        bwd = sp.no_backward({"form": form, "hd": hd, "gqa": gqa, "mask": mask}) is None
                        if not bwd and det == "off":
                            continue
                        i += 1
                        try:
                            p = problem_for(sp, row, 20_000 + i, seed=0)
                        except Exception as e:
                            out.append((row, None, bwd, det == "on", None, None, f"problem_for: {e}"[:200]))
                            continue
                        try:
                            f, b = V.variants_of(p, backward=bwd, deterministic=det == "on")
                            out.append((row, p, bwd, det == "on", f, b, None))
                        except Exception as e:
                            out.append((row, p, bwd, det == "on", None, None, f"{type(e).__name__}: {e}"[:300]))
print(len(out), "rows", round(time.time() - t0), "s")
pickle.dump(out, open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"enum_{'_'.join(forms)}.pkl"), "wb"))
