"""The feature x arch table (README: its summary; ``docs/features.md``: in full): FA4's support claims (``fa4verify.kernels.features``, read
from ``interface.py``) joined with the evidence fa4verify holds for each cell.

Evidence, per cell, from files in the checkout (nothing is typed by hand):

* **measured on <GPU>**: ``docs/results/features/h200/features_<section>.json`` written by
  ``scripts/gpu/features.sh`` (``where`` says the GPU; the max tightness of the judged outputs);
* **compile-only**: ``docs/results/features/compile_only_<arch>.json`` (``python -m
  fa4verify.compile.features``): compiles / FA4 refuses / the compiler aborts;
* **CPU twin**: the feature's numerics are modelled by a twin in ``kernels/`` (listed in
  :data:`TWIN`) and tested on the CPU;
* otherwise the cell says FA4's claim and "not run by fa4verify yet".

``python -m fa4verify.tables.features --write README.md`` replaces the block between
``<!-- feature-table:start -->`` and ``<!-- feature-table:end -->`` with each cell's summary
(:func:`cell_summary`: FA4's claim and the kinds of evidence), ``--full --write docs/features.md``
with every cell's evidence (:func:`cell_text`); ``--check FILE`` (with ``--full`` for the latter)
exits 1 when a block is stale (``tests/test_feature_table.py`` runs both).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from fa4verify.kernels import features as F

__all__ = ["TWIN", "COMPILE_KIND", "load_evidence", "cell_text", "cell_summary", "render", "replace_block", "main"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "features"
START, END = "<!-- feature-table:start -->", "<!-- feature-table:end -->"

#: cells whose numerics a CPU twin models (feature, arch, direction) -> what
TWIN: dict[tuple[str, str, str], str] = {
    ("combine", "sm90", "fwd"): "`kernels/twin_combine.py`",
    ("combine", "sm100", "fwd"): "`kernels/twin_combine.py`",
    ("split_kv", "sm100", "fwd"): "the audit's split-KV plan rows (`num_splits` 2, 3; hd != hdv: FA4's 64-key "
                                  "tiles and own count; masked: one query tile) and fuzz draws: each fp32 partial, FA4's internal combine and the merged "
                                  "output within the composed budget (Note [Split-KV as a call form]; "
                                  "`tests/test_split_kv.py`)",
    ("fp8", "sm100", "fwd"): "the audit's fp8 plan with q/k/v descales within the composed budget "
                             "(`fa4verify audit --dtype fp8`, Note [FP8 descales]; FA #2577's threshold)",
    ("mla", "sm100", "fwd"): "the audit's MLA edges (each MLA forward kernel) within the composed budget "
                             "(Note [MLA as a call form]; `tests/test_mla_call_form.py`)",
    ("gather", "sm100", "fwd"): "the audit's top-k gather edges within the composed budget "
                                "(Note [MLA as a call form])",
    ("mla", "sm100", "bwd"): "the audit's gather edges' sparse backward (saved and rebuilt P) and its public "
                             "path with dLSE within the composed budgets (DERIVATIONS.md#mla-bwd)",
    ("gather", "sm100", "bwd"): "as the MLA backward (DERIVATIONS.md#mla-bwd)",
}
#: feature_compile kind(s) of each (feature, direction); FA4 has a backward for MLA only on the
#: sparse (gather) path, so both the MLA and the gather backward cells read the gather cases
COMPILE_KIND: dict[tuple[str, str], Any] = {
    ("paged_kv", "fwd"): "paged", ("split_kv", "fwd"): "split_kv",
    ("combine", "fwd"): "combine", ("block_sparse", "bwd"): "sparse_bwd",
    ("block_sparse", "fwd"): "sparse_fwd", ("score_mod", "fwd"): "mask_mod_fwd",
    ("mla", "fwd"): "mla_fwd", ("mla", "bwd"): ("gather_bwd", "gather_bwd_rp"),
    ("gather", "fwd"): "gather_fwd", ("gather", "bwd"): ("gather_bwd", "gather_bwd_rp"),
    ("fp8", "fwd"): "fp8_fwd", ("seqused", "fwd"): "seqused_fwd", ("seqused", "bwd"): "seqused_bwd"}
#: how a case of each kind is named in a cell: (prefix, value) -- values of one prefix are joined
_CASE_NAME = {
    "paged": lambda c: ("page", str(c["page_size"])),
    "split_kv": lambda c: ("splits", str(c["num_splits"])),
    "combine": lambda c: ("splits", str(c["num_splits"])),
    "mla_fwd": lambda c: ("hd 64 + 512, heads", str(c["nheads"])),
    "gather_fwd": lambda c: ("hd 64 + 512, top-256, heads", str(c["nheads"])),
    "gather_bwd": lambda c: ("saved P, heads", str(c["nheads"])),
    "gather_bwd_rp": lambda c: ("recomputed P, heads", str(c["nheads"])),
    "fp8_fwd": lambda c: ("e4m3 + q/k/v descale, hd", str(c["head_dim"])),
    "seqused_fwd": lambda c: ("seqused_k, hd", str(c["head_dim"])),
    "seqused_bwd": lambda c: ("seqused_k, hd", str(c["head_dim"])),
}
#: compile-only kinds of the score_mod / mask_mod pairs (``fa4verify.mods``), per direction
MOD_KIND = {"fwd": "mod_fwd", "bwd": "mod_bwd"}
_ARCH_FILE = {"sm90": "sm90a", "sm100": "sm100a"}
#: H200 section that measures a cell
_H200 = {("paged_kv", "fwd"): "paged", ("combine", "fwd"): "combine", ("split_kv", "fwd"): "combine",
         ("block_sparse", "bwd"): "sparse", ("seqused", "fwd"): "paged", ("block_sparse", "fwd"): "sparse_fwd",
         ("score_mod", "fwd"): "sparse_fwd", ("seqused", "bwd"): "seqused_bwd"}


def load_evidence(results: Path = RESULTS) -> dict[str, Any]:
    ev: dict[str, Any] = {"compile": {}, "h200": {}}
    for arch, f in _ARCH_FILE.items():
        p = results / f"compile_only_{f}.json"
        if p.is_file():
            ev["compile"][arch] = json.loads(p.read_text())["results"]
    for sec in ("paged", "combine", "sparse_fwd", "sparse", "seqused_bwd", "mods"):
        p = results / "h200" / f"features_{sec}.json"
        if p.is_file():
            ev["h200"][sec] = json.loads(p.read_text())
    return ev


def _assert_message(err: str) -> str:
    """The message of an ``AssertionError: <msg>`` record (first 70 characters)."""
    msg = err.split("AssertionError:", 1)[-1].strip().splitlines()[0] if err else ""
    return msg[:70] + ("..." if len(msg) > 70 else "")


def _mods_compile_text(c: F.Cell, recs: list[dict]) -> Optional[str]:
    rows = [r for r in recs if r["case"]["kind"] == MOD_KIND[c.direction]]
    if not rows:
        return None
    ok = [r["case"]["mod"] for r in rows if r["ok"]]
    bad = [r["case"]["mod"] for r in rows if not r["ok"]]
    hd = sorted({r["case"]["head_dim"] for r in rows})
    s = f"{len(ok)}/{len(rows)} mod pairs ({'/'.join(sorted(ok))}) compile at hd {'/'.join(map(str, hd))}"
    if bad:
        s += f"; {'/'.join(sorted(bad))} fail to compile"
    return s


def _compile_text(c: F.Cell, recs: list[dict]) -> Optional[str]:
    if c.feature == "score_mod":
        mt = _mods_compile_text(c, recs)
        if mt:
            return "compile-only: " + mt
    kinds = COMPILE_KIND.get((c.feature, c.direction))
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds or ())
    parts = []
    for kind in kinds:
        rows = [r for r in recs if r["case"]["kind"] == kind]
        if rows:
            # two kinds refused with the same assertion (both sparse MLA backward modes) read once
            parts.extend(p for p in _kind_parts(kind, rows) if p not in parts)
    if not parts:
        return None
    return "compile-only: " + ", ".join(parts)


def _kind_parts(kind: str, rows: list[dict]) -> list[str]:
    ok = [r for r in rows if r["ok"]]
    bad = [r for r in rows if not r["ok"]]
    namer = _CASE_NAME.get(kind, lambda cs: ("hd", str(cs["head_dim"])))
    name = namer(rows[0]["case"])[0]

    def vals(rs):
        return "/".join(namer(r["case"])[1] for r in rs)
    parts = []
    if ok:
        parts.append(f"{name} {vals(ok)} compile")
    if bad:
        aborted = [r for r in bad if r.get("aborted")]
        refused = [r for r in bad if not r.get("aborted")]
        if refused and all("AssertionError" in (r["error"] or "") for r in refused) and not ok:
            msgs = sorted({_assert_message(r["error"]) for r in refused})
            # the legacy kinds keep their short text; the newer kinds quote FA4
            where = (" in the forward it needs" if kind in ("gather_bwd", "gather_bwd_rp")
                     and all(r.get("stage") == "forward" for r in refused) else
                     " in the backward" if kind in ("gather_bwd", "gather_bwd_rp") else "")
            parts.append("FA4 asserts" if kind in ("split_kv",) else
                         f"FA4 asserts{where} (" + "; ".join(f'"{m}"' for m in msgs) + ")")
        elif refused:
            parts.append(f"{name} {vals(refused)} fail to compile")
        if aborted:
            parts.append(f"{name} {vals(aborted)} abort the compiler")
    return parts


def _mods_h200_text(c: F.Cell, d: dict[str, Any]) -> str:
    where = d.get("where", "?")
    r = d.get("result")
    if r is None:
        return f"{where}: the mods run crashed ({str(d.get('crash', '?'))[:60]})"
    part = r.get(c.direction) or {}
    n_err = len(r.get("errors") or [])
    t = part.get("max_tightness")
    cfgs = [((row.get("config") or {}).get("fwd") or {}) for row in r.get("rows", [])]
    mha = all((x.get("q_shape") or [0, 0, 0])[2] == (x.get("k_shape") or [0, 0, -1])[2] for x in cfgs)
    s = (f"{where}: {part.get('n_runs', 0)} mod-pair runs ({'/'.join(r.get('pairs', []))}"
         f"{', nheads_kv == nheads only' if mha else ''}) "
         f"{'within budget' if part.get('all_within_budget') else 'NOT all within budget'}"
         + (f", max tightness {t:.3g}" if t is not None else "") + (f", {n_err} runs failed" if n_err else ""))
    names = ("out", "lse") if c.direction == "fwd" else ("dq", "dk", "dv")
    eq = []
    for pair, x in sorted((r.get("vs_builtin") or {}).items()):
        bw = (x or {}).get("bitwise") or {}
        if not bw:
            eq.append(f"{pair} vs built-in not run")
            continue
        same = all(bw.get(n) for n in names)
        eq.append(f"{pair} {'bitwise equal to' if same else 'differs from'} the built-in"
                  + ("" if same or not x.get("builtin_within_budget") else " (both within budget)"))
    if eq:
        s += "; " + ", ".join(eq)
    return s


def _h200_text(c: F.Cell, h200: dict[str, Any]) -> Optional[str]:
    if c.feature == "score_mod" and c.arch == "sm90" and "mods" in h200:
        return _mods_h200_text(c, h200["mods"])
    if c.feature == "score_mod" and c.arch == "sm90" and c.direction == "bwd":
        return "H200: not run yet (`scripts/gpu/mods.sh`)"
    sec = _H200.get((c.feature, c.direction))
    if sec is None or c.arch != "sm90":
        return None
    d = h200.get(sec)
    if d is None:
        return "H200: not run yet (`scripts/gpu/features.sh`)"
    where = d.get("where", "?")
    r = d.get("result")
    if r is None:
        if c.feature == "split_kv":
            return f"{where}: num_splits not reached (the {sec} section crashed first)"
        return (f"{where}: crashed ({d.get('crash', '?')[:60]}...; not yet diagnosed: fa4verify's call "
                f"or FA4)")
    if sec == "seqused_bwd":
        rows = [x for x in r.get("rows", []) if "dq" in x]
        if not rows:
            return f"{where}: seqused_k backward did not run ({'; '.join(r.get('errors', []))[:80]})"
        t = r.get("max_tightness")
        ok = r.get("all_within_budget")
        return (f"{where}: seqused_k backward (causal and not) {'within budget' if ok else 'NOT within budget'}, "
                f"max tightness {t:.3g}")
    if c.feature == "seqused":
        rows = [x for x in r.get("rows", []) if x.get("layout") == "contiguous+seqused_k" and "out" in x]
        if not rows:
            return f"{where}: seqused_k row missing"
        x = rows[0]
        t = max(x["out"]["tightness"], x["lse"]["tightness"])
        ok = x["out"]["status"] == x["lse"]["status"] == "pass"
        return f"{where}: seqused_k {'within budget' if ok else 'NOT within budget'}, max tightness {t:.3g}"
    if c.feature == "score_mod":
        eq = r.get("checkerboard_vs_mask_mod", {})
        m = eq.get("mask_mod", {})
        if "out" not in m:
            return f"{where}: mask_mod run failed ({str(m.get('error', 'missing'))[:60]})"
        t = max(m["out"]["tightness"], m["lse"]["tightness"])
        ok = m["out"]["status"] == m["lse"]["status"] == "pass"
        be = eq.get("bitwise_equal", {})
        return (f"{where}: mask_mod (checkerboard) {'within budget' if ok else 'NOT within budget'}, max tightness "
                f"{t:.3g}; {'bitwise equal to' if be.get('out') and be.get('lse') else 'differs from'} the "
                f"equivalent block-sparse run")
    if c.feature == "split_kv":
        return f"{where}: num_splits=2 -> {str(r.get('num_splits_2'))[:50]}"
    if sec == "sparse":
        return (f"{where}: prediction {r.get('verdict')}; hd not running {r.get('predicted_hds_not_running')}, "
                f"wrong values {r.get('predicted_hds_wrong_values')}, controls right {r.get('controls_right')}")
    t = r.get("max_tightness")
    s = f"{where}: {'within budget' if r.get('all_within_budget') else 'NOT within budget'}, max tightness " \
        f"{t:.3g}" if t is not None else f"{where}: nothing judged"
    if sec == "paged":
        s += f", permutation {'bitwise equal' if r.get('permutation_bitwise') else 'NOT bitwise equal'}"
        bad = [x for x in r.get("rows", []) if "out" in x and x["out"]["status"] != "pass"]
        good = sorted({x["page_size"] for x in r.get("rows", []) if x.get("page_size") and x not in bad})
        if bad and all(x.get("nan_in_output") for x in bad):
            ps = sorted({x["page_size"] for x in bad})
            s += (f"; finding: at page {'/'.join(map(str, ps))} (TMA) the seqused_k=0 sequence's O is NaN "
                  f"where its pages hold NaN (LSE right; `scripts/gpu_paged_empty_nan.py`, "
                  f"docs/results/h200_session4/README.md)"
                  + (f"; page {'/'.join(map(str, good))} within budget" if good else ""))
    if sec == "combine":
        dts = sorted({str((x.get("config") or {}).get("partial_dtype")) for x in r.get("rows", [])
                      if x.get("config")})
        if dts:
            s += f" ({'/'.join(dts)} partials, FA4's split-KV format; composed vs the full oracle and the stage alone)"
        wrong = _combine_16bit_finding()
        if wrong:
            s += (f"; finding: 16-bit partials give wrong O ({wrong}; the O-partial copy covers twice the "
                  f"tile's rows, `fa4_params.combine_partial_tiling`; docs/results/h200_session5/README.md)")
    return s


def _combine_16bit_finding() -> Optional[str]:
    """The H200 diagnosis of ``flash_attn_combine``: the 16-bit cases measured wrong."""
    p = RESULTS.parent / "h200_session5" / "combine" / "combine_diag.json"
    if not p.is_file():
        return None
    cases = json.loads(p.read_text()).get("cases", {})
    n16 = [n for n, r in cases.items() if ("bf16" in n or "fp16" in n) and "frac_elems_wrong" in r]
    bad = [n for n in n16 if cases[n]["frac_elems_wrong"] > 0]
    if not bad:
        return None
    worst = max(cases[n]["max_abs_err_out"] for n in bad)
    return f"{len(bad)}/{len(n16)} bf16/fp16 cases wrong, max abs error {worst:.3g}"


#: how a cell states FA4's claim
_CLAIM = {"supported": "supported", "not supported": "**not supported by FA4**", "n/a": "n/a"}


def cell_text(c: F.Cell, ev: dict[str, Any]) -> str:
    where = ", ".join(F.check_evidence(c)) if _fa4_installed() else "interface.py"
    claim = _CLAIM[c.status]
    parts = [f"{claim} ({where}{'; ' + c.note if c.note else ''})"]
    if c.status == "n/a":
        return parts[0]
    h = _h200_text(c, ev["h200"])
    if h:
        parts.append(h)
    ct = _compile_text(c, ev["compile"].get(c.arch, []))
    if ct:
        parts.append(ct)
    tw = TWIN.get((c.feature, c.arch, c.direction))
    if tw:
        parts.append(f"CPU twin: {tw}")
    if len(parts) == 1 and c.status == "supported":
        parts.append("not run by fa4verify yet")
    return "; ".join(parts)


#: words of a cell's evidence text that record an FA4 finding or a failure (:func:`cell_summary`)
_NOT_CLEAN = ("finding", "NOT ", "failed", "crashed", "did not run", "does not run", "fail to compile", "abort")


def cell_summary(c: F.Cell, ev: dict[str, Any]) -> str:
    """The README's short form of :func:`cell_text`: FA4's claim and the kinds of evidence held,
    ``(!)`` after a kind whose text records an FA4 finding or a failure (on a cell FA4 claims to
    support); the full text is in ``docs/features.md``."""
    claim = _CLAIM[c.status]
    if c.status == "n/a":
        return claim

    def mark(text: str) -> str:
        return " (!)" if c.status == "supported" and any(w in text for w in _NOT_CLEAN) else ""
    kinds = []
    h = _h200_text(c, ev["h200"])
    if h:
        kinds.append("H200: not run yet" if h.startswith("H200: not run yet") else h.split(":")[0] + mark(h))
    ct = _compile_text(c, ev["compile"].get(c.arch, []))
    if ct:
        kinds.append("compile-only" + mark(ct))
    if TWIN.get((c.feature, c.arch, c.direction)):
        kinds.append("CPU twin")
    if not kinds and c.status == "supported":
        kinds.append("not run by fa4verify yet")
    return claim + (": " + ", ".join(kinds) if kinds else "")


def _fa4_installed() -> bool:
    try:
        F.fa4_source()
        return True
    except (ImportError, FileNotFoundError):
        return False


def render(ev: Optional[dict[str, Any]] = None, *, full: bool = True) -> str:
    """The table: every cell's full text (``full``: ``docs/features.md``) or its summary (the
    README's)."""
    ev = load_evidence() if ev is None else ev
    cols = [(a, d) for a in F.ARCHS for d in F.DIRECTIONS]
    head = "| feature | " + " | ".join(f"{'SM90' if a == 'sm90' else 'SM100/110'} {d}" for a, d in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    text = cell_text if full else cell_summary
    for f, label in F.FEATURES.items():
        cells = [text(F.cell(f, a, d), ev).replace("|", "\\|") for a, d in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def replace_block(text: str, table: str, start: str = START, end: str = END) -> str:
    """``text`` with the generated block between the ``start`` and ``end`` markers replaced."""
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block")
    a = text.index(start) + len(start)
    b = text.index(end)
    return text[:a] + "\n" + table + text[b:]


def write_or_check(prog: str, table: str, *, write: Optional[str], check: Optional[str], start: str = START,
                   end: str = END, rerun: str = "") -> int:
    """The ``--write FILE`` / ``--check FILE`` / stdout logic of a generated markdown block:
    exit 0, 1 (``--check``: the file's block is stale) or 2 (unreadable file, no markers)."""
    path = write or check
    if path is None:
        sys.stdout.write(table)
        return 0
    p = Path(path)
    try:
        old = p.read_text(encoding="utf-8")
        new = replace_block(old, table, start, end)
    except (OSError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if check:
        if new != old:
            print(f"{prog}: {path} is stale; run --write {path}{rerun}", file=sys.stderr)
            return 1
        return 0
    p.write_text(new, encoding="utf-8")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa4verify.tables.features",
                                 description="The feature x arch table: the README's summary (default) or, "
                                             "with --full, every cell's evidence (docs/features.md).")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    ap.add_argument("--full", action="store_true", help="every cell's full evidence text")
    ns = ap.parse_args(argv)
    return write_or_check("fa4verify.tables.features", render(full=ns.full), write=ns.write, check=ns.check,
                          rerun=" --full" if ns.full else "")


if __name__ == "__main__":
    raise SystemExit(main())
