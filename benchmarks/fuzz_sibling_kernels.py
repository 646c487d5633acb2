"""Do fuzz siblings run their group's FA4 kernels? Read from a GPU audit's JSON report.

Note [Siblings share compile keys] (fa4verify._strategies.problem.problem_groups) predicts that a
sibling -- a drawn production problem with other values, or a varlen batch with other lengths
below its maxima -- runs exactly the kernels of the problem it was drawn with. The audit measures
which kernels every fuzz.production example ran (``details["example_kernels"]``: FA4 compile-key
digests, Note [Compile keys in the timeline]). This script redraws the campaign from the report
(seed, profile, head dims, features, siblings, examples: the draw is deterministic, checked by its
digest) and prints, per sibling, whether it needed a kernel its group's first problem did not.

    python benchmarks/fuzz_sibling_kernels.py REPORT.json

Exit 0 when every sibling ran only its group's kernels, 1 when some did not or have no record
(listed: an example that ran no kernel, e.g. one FA4 refused, shows nothing), 2 on bad
input (no fuzz.production result with kernels, or a draw that does not match the report's).
"""
from __future__ import annotations

import hashlib
import json
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python benchmarks/fuzz_sibling_kernels.py REPORT.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            rep = json.load(f)
        res = next(r for r in rep["results"] if r["id"] == "fuzz.production")
        det = res["details"]
        kernels = det["example_kernels"]
    except (OSError, ValueError, KeyError, StopIteration) as e:
        print(f"fuzz_sibling_kernels: error: {argv[0]}: no fuzz.production result with example kernels "
              f"({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    from fa4verify._strategies.problem import sibling_key
    from fa4verify.fuzz import drawn
    from fa4verify.targets import production_features
    arch = (rep.get("config", {}).get("archs") or ["sm90"])[0]
    feats = tuple(f for f in det.get("features_drawn_from", ()) if f in production_features())
    limits = {"max_head_dim": 256}
    if det.get("head_dims_drawn_from") not in (None, "all"):
        limits["head_dim_choices"] = list(det["head_dims_drawn_from"])
    profile = {"quick": "ci", "default": "ci", "full": "dev", "exhaustive": "nightly"}[rep["config"]["profile"]]
    ps = drawn.draw_problems(arch=arch, dtype=rep["config"]["dtype"], examples=int(det["examples_drawn"]),
                             seed=int(rep["config"]["seed"]), profile=profile, features=feats, limits=limits,
                             siblings=int(det.get("siblings", 0)))
    digest = hashlib.sha256("".join(p.digest() for p in ps).encode()).hexdigest()[:16]
    if digest != det.get("draw_digest"):
        print(f"fuzz_sibling_kernels: error: the redrawn campaign ({digest}) is not the report's "
              f"({det.get('draw_digest')}): another fa4verify or Hypothesis version?", file=sys.stderr)
        return 2
    groups: list[list[int]] = []
    for i, p in enumerate(ps):
        if groups and sibling_key(p) == sibling_key(ps[groups[-1][0]]):
            groups[-1].append(i)
        else:
            groups.append([i])
    sibs = bad = unseen = 0
    for g in groups:
        base = set(kernels.get(str(g[0]), []))
        for j in g[1:]:
            sibs += 1
            if not kernels.get(str(j)) or not base:   # nothing recorded: not evidence either way
                unseen += 1
                print(f"  example {j} ({ps[j].describe()}): no kernels recorded for it or its group's first problem")
                continue
            extra = sorted(set(kernels.get(str(j), [])) - base)
            if extra:
                bad += 1
                print(f"  example {j} ({ps[j].describe()}): {len(extra)} kernel(s) its group's first "
                      f"problem did not run: {', '.join(extra)}")
    n_kernels = len({k for v in kernels.values() for k in v})
    print(f"{len(ps)} examples in {len(groups)} groups; {sibs} siblings, {sibs - bad - unseen} ran only "
          f"their group's kernels, {bad} did not, {unseen} without a record; {n_kernels} distinct FA4 "
          f"kernels in the campaign (draw {digest}, {res.get('where', '?')})")
    return 1 if bad or unseen else 0


if __name__ == "__main__":
    sys.exit(main())
