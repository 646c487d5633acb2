"""A covering-array plan of an audit's live cases: every supported pair of dimension values
(strength 2) and every supported triple of :data:`TRIPLES` (mask x form x pass, gqa x scale x
pass), at least once, deterministic per seed.

Note [Why our own covering-array generator]
-------------------------------------------
The well-kept libraries (``allpairspy``, ``covertable``) build arrays of one strength with a
row filter. This plan needs mixed strength (t = 2 over every dimension plus t = 3 over
the triples of :data:`TRIPLES`), a *derived* dimension (``pass``: a row covers the backward's tuples only
where FA4 has a backward for it) and a report of every supported tuple the array covers and of
every unsupported one with its reason. A filter-only generator cannot tell "unsupported" from
"not drawn", so the plan would need a coverage audit of its own anyway. The generator here is
AETG's greedy (Cohen et al., IEEE TSE 23(7), 1997): each new row starts from an uncovered tuple
and fills the other dimensions, in a seeded order, with the value that covers the most uncovered
tuples under the support predicate; the best of a few candidates is kept. ``coverage()``
re-derives the covered set from the rows alone, and a test checks it against brute force.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any, Iterable, Mapping, Optional, Sequence

from fa4verify.coverage.space import DIMENSIONS, PASSES, FeatureSpace

__all__ = ["Plan", "plan", "coverage", "TRIPLES", "required_tuples", "row_tuples", "no_valid_row"]

#: the strength-3 interactions the plan covers on top of every pair: every mask x call form x
#: pass, and every GQA ratio x softmax_scale x pass (GQA scales dK in the backward's dK
#: postprocess, MHA in the main kernel: a custom scale must meet each in a backward)
TRIPLES: tuple[tuple[str, ...], ...] = (("mask", "form", "pass"), ("gqa", "scale", "pass"))

Tuple_ = tuple[tuple[str, str], ...]


def _key(items: Iterable[tuple[str, str]]) -> Tuple_:
    return tuple(sorted(items))


def _pass_ok(space: FeatureSpace, partial: Mapping[str, str], p: str) -> bool:
    return p == "fwd" or space.no_backward(partial) is None


def required_tuples(space: FeatureSpace, *, triples: Sequence[Sequence[str]] = TRIPLES
                    ) -> tuple[set[Tuple_], dict[Tuple_, str]]:
    """(the supported tuples the plan must cover, the unsupported ones with their reason):
    every value pair of two dimensions, and every value triple of each ``triples`` entry."""
    dims = [d for d in DIMENSIONS if d in space.values]
    need: set[Tuple_] = set()
    why: dict[Tuple_, str] = {}

    def consider(assign: dict[str, str]) -> None:
        t = _key(assign.items())
        part = {k: v for k, v in assign.items() if k != "pass"}
        reason = space.why_not(part)
        if reason is None and "pass" in assign and not _pass_ok(space, part, assign["pass"]):
            reason = space.no_backward(part)
        if reason is None:
            reason = _no_completion(space, part, assign.get("pass"))
        if reason is None:
            need.add(t)
        else:
            why[t] = reason

    for a, b in itertools.combinations(dims, 2):
        for va in space.values[a]:
            for vb in space.values[b]:
                consider({a: va, b: vb})
    for tri in triples:
        vals = [PASSES if d == "pass" else space.values[d] for d in tri]
        for combo in itertools.product(*vals):
            consider(dict(zip(tri, combo)))
    return need, why


def _no_completion(space: FeatureSpace, part: Mapping[str, str], pass_: Optional[str]) -> Optional[str]:
    """Why no valid full row holds ``part`` (and runs ``pass_``), or None when one does.

    Note [Supported means completable]: the support rules name at most two dimensions, so a
    tuple they allow may still have no valid row once every dimension is filled, e.g. in a
    deployment whose only head dim is SM100's (256, 256) on a release with a dedicated forward
    there (4.0.0b20..b33), a window and det=off are each allowed with everything but the head dim,
    which allows no window. Such a tuple is unsupported (with
    the reason of the dimension that has no value left), not a hole the plan failed to cover.
    Decided by depth-first search over the remaining dimensions, pruned by the support rules."""
    dims = [d for d in DIMENSIONS if d in space.values and d not in part]
    deepest: list = [-1, None]          # (depth, reason) of the deepest dimension a rule pruned

    def go(row: dict[str, str], i: int) -> bool:
        if i == len(dims):
            if space.why_not(row) is None and (pass_ is None or _pass_ok(space, row, pass_)):
                return True
            if i > deepest[0]:
                deepest[:] = [i, space.why_not(row) or space.no_backward(row)]
            return False
        d = dims[i]
        for v in space.values[d]:
            trial = dict(row, **{d: v})
            why = space.why_not(trial)
            if why is None and pass_ is not None and not _pass_ok(space, trial, pass_):
                why = space.no_backward(trial)      # prune as soon as the backward is ruled out
            if why is None:
                if go(trial, i + 1):
                    return True
            elif i > deepest[0]:          # the first reason at the deepest dimension: the values' order
                deepest[:] = [i, why]
        return False

    if go(dict(part), 0):
        return None
    return deepest[1] or f"no valid row holds {_name(_key(part.items()))}"


def no_valid_row(space: FeatureSpace) -> Optional[str]:
    """Why the space holds no valid row at all (nothing FA4 supports in it), or None."""
    empty = [d for d in DIMENSIONS if d in space.values and not space.values[d]]
    if empty:
        return "; ".join(space.notes.get(d, f"no {d} value") for d in empty)
    return _no_completion(space, {}, None)


def row_tuples(space: FeatureSpace, row: Mapping[str, str], *, triples: Sequence[Sequence[str]] = TRIPLES,
               passes: Optional[Sequence[str]] = None) -> set[Tuple_]:
    """The tuples a full ``row`` covers (pairs of its values; triples for each pass it runs, or for
    ``passes``: those that were judged)."""
    dims = [d for d in DIMENSIONS if d in row]
    out = {_key([(a, row[a]), (b, row[b])]) for a, b in itertools.combinations(dims, 2)}
    for p in (space.passes(row) if passes is None else passes):
        full = dict(row, **{"pass": p})
        for tri in triples:
            out.add(_key((d, full[d]) for d in tri))
    return out


@dataclasses.dataclass
class Plan:
    """The rows of a plan and what they cover."""
    space: FeatureSpace
    seed: int
    rows: list[dict[str, str]]
    required: set
    unsupported: dict
    uncoverable: list

    def coverage(self, rows: Optional[Sequence[Mapping[str, str]]] = None) -> dict[str, Any]:
        return coverage(self.space, self.rows if rows is None else rows, required=self.required,
                        unsupported=self.unsupported)


def _gain(space: FeatureSpace, row: Mapping[str, str], dim: str, val: str, uncovered: set) -> int:
    n = 0
    for d, v in row.items():
        if _key([(d, v), (dim, val)]) in uncovered:
            n += 1
    if dim in ("mask", "form") or "mask" in row or "form" in row:
        trial = dict(row, **{dim: val})
        if "mask" in trial and "form" in trial:
            for p in PASSES:
                if _pass_ok(space, trial, p) and _key([("mask", trial["mask"]), ("form", trial["form"]),
                                                       ("pass", p)]) in uncovered:
                    n += 1
    return n


def _complete(space: FeatureSpace, start: dict[str, str], uncovered: set, rng: random.Random
              ) -> Optional[dict[str, str]]:
    """``start`` filled greedily to a full valid row, or None when no completion is valid."""
    row = dict(start)
    dims = [d for d in DIMENSIONS if d in space.values and d not in row]
    rng.shuffle(dims)
    for d in dims:
        best, best_gain = None, -1
        vals = list(space.values[d])
        rng.shuffle(vals)
        for v in vals:
            trial = dict(row, **{d: v})
            if space.why_not(trial) is not None:
                continue
            g = _gain(space, row, d, v, uncovered)
            if g > best_gain:
                best, best_gain = v, g
        if best is None:
            return None
        row[d] = best
    return row if space.why_not(row) is None else None


def plan(space: FeatureSpace, *, seed: int = 0, candidates: int = 8,
         triples: Sequence[Sequence[str]] = TRIPLES) -> Plan:
    """The covering-array plan of ``space`` (Note [Why our own covering-array generator]):
    deterministic in (space, seed). Every required tuple is covered, or listed in
    ``Plan.uncoverable`` (a supported pair no valid full row holds: a bug of the space's rules)."""
    required, unsupported = required_tuples(space, triples=triples)
    uncovered = set(required)
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    uncoverable: list = []
    order = sorted(uncovered)
    while uncovered:
        best, best_new = None, set()
        seeds = [t for t in order if t in uncovered][:max(1, candidates)]
        for t in seeds:
            start = {d: v for d, v in t if d != "pass"}
            for _ in range(3):
                row = _complete(space, start, uncovered, rng)
                if row is not None:
                    break
            if row is None:
                continue
            new = row_tuples(space, row, triples=triples) & uncovered
            if len(new) > len(best_new):
                best, best_new = row, new
        if best is None or not best_new:
            # the first seed tuple cannot be completed to a valid row
            t = seeds[0]
            uncoverable.append(t)
            uncovered.discard(t)
            continue
        rows.append(best)
        uncovered -= best_new
    return Plan(space, seed, rows, required, unsupported, uncoverable)


def coverage(space: FeatureSpace, rows: Sequence[Mapping[str, str]], *, required: Optional[set] = None,
             unsupported: Optional[dict] = None, triples: Sequence[Sequence[str]] = TRIPLES,
             passes: Optional[Sequence[Optional[Sequence[str]]]] = None) -> dict[str, Any]:
    """What ``rows`` cover of the space's required tuples: counts per dimension pair (and per
    triple), the holes by name and the unsupported tuples with their reasons (JSON-able).
    ``passes[i]``: the passes row i had judged (None: every pass it runs)."""
    if required is None or unsupported is None:
        required, unsupported = required_tuples(space, triples=triples)
    got: set = set()
    for i, r in enumerate(rows):
        got |= row_tuples(space, r, triples=triples, passes=None if passes is None else passes[i])
    covered = required & got
    holes = sorted(required - got)

    def group(t: Tuple_) -> str:
        return " x ".join(d for d, _ in t)

    per: dict[str, dict[str, int]] = {}
    for t in required:
        g = per.setdefault(group(t), {"covered": 0, "supported": 0})
        g["supported"] += 1
        g["covered"] += int(t in covered)
    unsup: dict[str, int] = {}
    for t in unsupported:
        unsup[group(t)] = unsup.get(group(t), 0) + 1
    return {"rows": len(rows), "supported": len(required), "covered": len(covered),
            "holes": [_name(t) for t in holes], "per_group": dict(sorted(per.items())),
            "unsupported": {_name(t): why for t, why in sorted(unsupported.items())},
            "unsupported_per_group": dict(sorted(unsup.items()))}


def _name(t: Tuple_) -> str:
    return ", ".join(f"{d}={v}" for d, v in t)
