import json, sys
import numpy as np
sys.path.insert(0, "/work/main")
from fa4verify.problem import AttentionProblem
from fa4verify.call_layout import call_arrays
from fit_triage import model_out
from repro_triage import parse
variants = {
 "none": lambda kind, n, j, zero: False,
 "all": lambda kind, n, j, zero: True,
 "n=1 only (last)": lambda kind, n, j, zero: n == 1,
 "n=0 only": lambda kind, n, j, zero: n == 0,
 "n=0 zeros only": lambda kind, n, j, zero: n == 0 and zero,
 "n=0 data only": lambda kind, n, j, zero: n == 0 and not zero,
 "K only": lambda kind, n, j, zero: kind == "K",
 "V only": lambda kind, n, j, zero: kind == "V",
 "n=1 K": lambda kind, n, j, zero: n == 1 and kind == "K",
 "n=1 V": lambda kind, n, j, zero: n == 1 and kind == "V",
}
for fn in sys.argv[1:]:
    d = json.load(open(fn))
    for var in d["variants"]:
        if var["variant"] not in ("only sequence 0", "page_size 32", "page_size 64", "page_size 128"):
            continue
        frac, worst = parse(var["detail"])
        p = AttentionProblem.from_dict(var["problem"]); a = p.materialize(); c = call_arrays(p, a)
        print(fn.split('/')[-1], var["variant"], worst)
        for name, f in variants.items():
            for cr in (False, True):
                o = model_out(p, c, a.get("learnable_sink"), schedule="none", oob_wins=f, sq=lambda m, n: m >= n,
                              cross=(lambda *args, _c=cr: _c))
                print(f"   {name:18s} cross={cr!s:5s}", " ".join(f"{o[t,h,dd]:+.4f}({g:+.4f})" for t, h, dd, g, _ in worst))
