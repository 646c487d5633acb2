"""Self-contained HTML audit report: inline CSS, plots as base64 PNG (matplotlib, Agg canvas).

Plots come from each check's ``details["plot"]`` (one dict or a list), following
:data:`fa4verify.audit.registry.PLOT_CONVENTION`; a check without plots gets a table of its
metrics (and of ``details["table"]`` = {"columns": [...], "rows": [[...]]} if present).  The
overview plot shows every check's budget tightness (measured / budget).  A plot that cannot be
drawn (malformed data) is replaced by a one-line note; the report is still written.

No pyplot: figures are built with ``matplotlib.figure.Figure`` and ``FigureCanvasAgg`` so the
global matplotlib state (and any interactive backend) is never touched.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any, Sequence

from fa4verify.audit.report_json import as_number

STATUS_COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#8250df", "undecided": "#9a6700",
                "skip": "#6e7781"}
PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#1b7c83", "#6e7781"]

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1f2328;
max-width:1200px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;border-bottom:1px solid #d0d7de;padding-bottom:4px;
margin-top:28px}h3{font-size:16px;margin:18px 0 4px}
.verdict{font-size:18px;font-weight:600;padding:10px 14px;border-radius:6px;color:#fff;display:inline-block}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.st{font-weight:700;color:#fff;border-radius:4px;padding:1px 6px;font-size:12px}
.check{border:1px solid #d0d7de;border-radius:6px;padding:8px 14px;margin:12px 0}
.where{color:#0969da;font-weight:600}.muted{color:#6e7781}.note{color:#9a6700}
img.plot{max-width:100%;border:1px solid #eaeef2;margin:4px 0}
.scroll{overflow-x:auto;max-width:100%}h4{font-size:14px;margin:10px 0 2px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px;max-height:300px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: Any) -> str:
    x = as_number(v)
    if x is None:
        return str(v)
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.5g}"


# ------------------------------------------------------------------------------------------ plots
def _figure(w: float = 7.5, h: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _nums(seq: Any, name: str) -> list[float]:
    if not isinstance(seq, (list, tuple)):
        raise ValueError(f"{name} must be a list")
    out = []
    for v in seq:
        x = as_number(v) if v is not None else float("nan")
        if x is None:
            raise ValueError(f"{name} has a non-numeric entry {v!r}")
        out.append(x)
    return out


def _axes_common(ax, p: dict[str, Any]) -> None:
    ax.set_title(str(p.get("title", "")), fontsize=11)
    if p.get("xlabel"):
        ax.set_xlabel(str(p["xlabel"]), fontsize=10)
    if p.get("ylabel"):
        ax.set_ylabel(str(p["ylabel"]), fontsize=10)
    if p.get("logy"):
        ax.set_yscale("log")
    if p.get("logx"):
        ax.set_xscale("log")
    ax.tick_params(labelsize=9)
    ax.grid(True, alpha=0.3)


def plot_histogram(p: dict[str, Any]) -> str:
    series = p.get("series")
    if series is None:
        series = {"": {"bins": p.get("bins"), "counts": p.get("counts")}}
    if not isinstance(series, dict) or not series:
        raise ValueError("histogram needs bins/counts or a non-empty series dict")
    fig = _figure()
    ax = fig.add_subplot()
    for i, (name, s) in enumerate(series.items()):
        edges = _nums(s.get("bins"), "bins")
        cnt = _nums(s.get("counts"), "counts")
        if len(edges) != len(cnt) + 1:
            raise ValueError(f"histogram {name!r}: len(bins) must be len(counts)+1")
        ax.stairs(cnt, edges, fill=len(series) == 1, alpha=0.75 if len(series) == 1 else 1.0,
                  color=PALETTE[i % len(PALETTE)], label=str(name) or None, linewidth=1.6)
    if len(series) > 1:
        ax.legend(fontsize=9)
    _axes_common(ax, p)
    return _png(fig)


def plot_bars(p: dict[str, Any]) -> str:
    """Horizontal bars, one per label, with a budget tick per bar when given.

    When the budgets span more than a factor 100 (bars in different units, e.g. a relative
    error next to ulps), every bar is drawn as measured / budget with the budget line at 1 and
    annotated "measured / budget" in its own units."""
    labels = [str(x) for x in (p.get("labels") or [])]
    vals = _nums(p.get("values"), "values")
    if len(labels) != len(vals) or not labels:
        raise ValueError("bars need equally long non-empty labels and values")
    budget = p.get("budget")
    bud = None
    if budget is not None:
        if not isinstance(budget, (list, tuple)):
            raise ValueError("bars: budget must be a list (one entry per bar, None for none)")
        bud = [float("nan") if b is None else (as_number(b) or float("nan")) for b in budget]
        if len(bud) != len(vals):
            raise ValueError("bars: budget must be as long as values")
    fin = [b for b in (bud or []) if math.isfinite(b) and b > 0]
    normalise = (bud is not None and len(fin) == len(vals) and len(fin) > 1
                 and max(fin) / min(fin) > 100.0)
    h = max(1.8, 0.42 * len(labels) + 1.2)
    fig = _figure(7.5, min(h, 12))
    ax = fig.add_subplot()
    y = list(range(len(labels)))
    colors = []
    for i, v in enumerate(vals):
        over = bud is not None and math.isfinite(bud[i]) and v > bud[i]
        colors.append("#cf222e" if over else "#0969da")
    q = dict(p)
    if normalise:
        assert bud is not None
        shown = [v / b for v, b in zip(vals, bud)]
        ax.barh(y, shown, color=colors, height=0.6, label="measured / budget", zorder=2)
        ax.axvline(1.0, color="#1f2328", linestyle="--", linewidth=1.5, label="budget", zorder=3)
        _annotate(ax, shown, y, texts=[f"{v:.3g} / {b:.3g}" for v, b in zip(vals, bud)])
        q["xlabel"] = "measured / budget (bars in different units)"
    else:
        ax.barh(y, vals, color=colors, height=0.6, label="measured", zorder=2)
        if bud is not None:
            ax.scatter([b for b in bud], y, marker="|", s=420, color="#1f2328", linewidths=2.5,
                       label="budget", zorder=3)
        _annotate(ax, vals, y)
        q["xlabel"] = p.get("ylabel") or p.get("xlabel")  # horizontal bars: values on x
    if bud is not None:
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    q["ylabel"] = None
    q["logy"] = False
    _axes_common(ax, q)
    return _png(fig)


def _annotate(ax, vals: Sequence[float], y: Sequence[int],
              texts: Sequence[str] | None = None) -> None:
    """Write each bar's value at its end (small values stay readable next to large ones)."""
    ax.margins(x=0.4 if texts else 0.1)
    for i, (v, yy) in enumerate(zip(vals, y)):
        if v == v:
            ax.annotate(texts[i] if texts else f"{v:.3g}", (v, yy), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=8)


def plot_lines(p: dict[str, Any]) -> str:
    x = _nums(p.get("x"), "x")
    series = p.get("series")
    if not isinstance(series, dict) or not series:
        raise ValueError("lines need x and a non-empty series dict")
    fig = _figure()
    ax = fig.add_subplot()
    for i, (name, ys) in enumerate(series.items()):
        yv = _nums(ys, f"series[{name}]")
        if len(yv) != len(x):
            raise ValueError(f"lines: series {name!r} has {len(yv)} points, x has {len(x)}")
        ax.plot(x, yv, marker="o", markersize=4, linewidth=1.6, color=PALETTE[i % len(PALETTE)],
                label=str(name))
    b = p.get("budget")
    if b is not None:
        if isinstance(b, (list, tuple)):
            ax.plot(x, _nums(b, "budget"), linestyle="--", color="#1f2328", label="budget")
        else:
            ax.axhline(float(as_number(b) or 0.0), linestyle="--", color="#1f2328", label="budget")
    ax.legend(fontsize=9)
    _axes_common(ax, p)
    return _png(fig)


def plot_overview(results: Sequence[dict[str, Any]]) -> str | None:
    rows = [(r["id"], as_number(r.get("tightness")), r["status"]) for r in results
            if as_number(r.get("tightness")) is not None and r["status"] != "skip"]
    rows = [(i, t, s) for i, t, s in rows if t is not None and math.isfinite(t)]
    if not rows:
        return None
    rows.sort(key=lambda t: -t[1])
    rows = rows[:40]
    fig = _figure(8.5, min(12, max(2.4, 0.36 * len(rows) + 1.3)))
    ax = fig.add_subplot()
    y = list(range(len(rows)))
    # log scale: a linear axis squeezes every pass next to a 100x failure
    ax.barh(y, [max(t, 1e-3) for _, t, _ in rows], color=[STATUS_COLOR.get(s, "#0969da") for *_, s in rows],
            height=0.6, zorder=2, left=1e-3)
    ax.set_xscale("log")
    ax.axvline(1.0, color="#1f2328", linestyle="--", linewidth=1.5, label="budget (= 1)")
    ax.set_yticks(y, [i for i, _, _ in rows])
    ax.invert_yaxis()
    _annotate(ax, [t for _, t, _ in rows], y)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _axes_common(ax, {"title": "budget tightness per check (measured / budget; > 1 violates; log scale)",
                      "xlabel": "measured / budget (log)"})
    return _png(fig)


PLOTTERS = {"histogram": plot_histogram, "bars": plot_bars, "lines": plot_lines}


def _table(columns: Sequence[Any], rows: Sequence[Sequence[Any]], limit: int = 200) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for row in list(rows)[:limit]:
        cells = []
        for v in row:
            cls = ' class="num"' if as_number(v) is not None and not isinstance(v, str) else ""
            cells.append(f"<td{cls}>{_e(_fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = (f'<p class="muted">{len(rows) - limit} more rows in the JSON report</p>'
            if len(rows) > limit else "")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def render_plot(p: Any) -> str:
    """One plot spec -> HTML (an <img> or a table), or a note if it cannot be drawn."""
    try:
        if not isinstance(p, dict):
            raise ValueError("a plot must be a dict")
        kind = p.get("kind")
        where = f'<div class="muted">{_e(p["where"])}</div>' if p.get("where") else ""
        if kind == "table":
            return (f"<h4>{_e(p.get('title', ''))}</h4>" + _table(p.get("columns") or [], p.get("rows") or [])
                    + where)
        if kind not in PLOTTERS:
            raise ValueError(f"unknown plot kind {kind!r} (histogram, bars, lines, table)")
        b64 = PLOTTERS[kind](p)
        return (f'<img class="plot" alt="{_e(p.get("title", kind))}" '
                f'src="data:image/png;base64,{b64}">{where}')
    except Exception as e:  # a malformed plot never breaks the report
        return f'<p class="note">plot not drawn: {_e(type(e).__name__)}: {_e(e)}</p>'


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[f"{prefix}{k}"] = ", ".join(_fmt(x) for x in v[:8]) + (" ..." if len(v) > 8 else "")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _generic_table(val: Any) -> str | None:
    """Tables for the other details entries: a list of dicts (one row each, nested dicts
    flattened to "a.b" columns) or a dict (key/value rows); scalars and empty values: None."""
    if isinstance(val, list) and val and all(isinstance(x, dict) for x in val):
        rows = [_flat(x) for x in val]
        cols: list[str] = []
        for r in rows:
            cols.extend(c for c in r if c not in cols)
        cols = cols[:40]
        return _table(cols, [[r.get(c, "") for c in cols] for r in rows])
    if isinstance(val, dict) and val:
        flat = _flat(val)
        return _table(["key", "value"], [[k, v] for k, v in list(flat.items())[:200]])
    return None


def _stat_items(val: Any) -> list[dict[str, Any]]:
    """StatVerdict dicts (``fa4verify.judge.statistical``) found in a check's details entry."""
    out: list[dict[str, Any]] = []
    if isinstance(val, dict) and "actual" in val and "predicted" in val:
        return [val]
    if isinstance(val, (list, tuple)):
        for x in val:
            out += _stat_items(x)
    return out


def plot_statistical(items: Sequence[dict[str, Any]]) -> str:
    """The statistical tier's pictures: ulp-error histograms (target vs the twin's prediction)
    per tensor, and the bias interval (target - twin, signed and radial) per tensor."""
    names: dict[str, list[dict[str, Any]]] = {}
    for it in items:
        names.setdefault(str(it.get("name")), []).append(it)
    fig = _figure(9.0, 3.6)
    ax1 = fig.add_subplot(1, 2, 1)
    from fa4verify.judge.statistical import HIST_EDGES
    edges = list(HIST_EDGES)
    for i, (n, its) in enumerate(names.items()):
        ha = [sum(c) for c in zip(*[x["actual"].get("hist") or [0] * (len(edges) - 1) for x in its])]
        hp = [sum(c) for c in zip(*[x["predicted"].get("hist") or [0] * (len(edges) - 1) for x in its])]
        col = PALETTE[i % len(PALETTE)]
        ax1.stairs(ha, edges, color=col, linewidth=1.6, label=f"{n} target")
        ax1.stairs(hp, edges, color=col, linewidth=1.0, linestyle="--", label=f"{n} twin")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7, ncol=2)
    _axes_common(ax1, {"title": "signed error (ulp of the reference)", "xlabel": "ulp (clipped to +-2)",
                       "ylabel": "elements"})
    ax1.set_yscale("log")
    ax2 = fig.add_subplot(1, 2, 2)
    y = 0
    labels = []
    for n, its in names.items():
        for it in its:
            for key, ci, c in (("bias_diff", "bias_ci", "#0969da"), ("radial_diff", "radial_ci", "#cf222e")):
                m, lo_hi = as_number(it.get(key)), it.get(ci) or [None, None]
                lo, hi = as_number(lo_hi[0]), as_number(lo_hi[1])
                if m is None or lo is None or hi is None or not all(map(math.isfinite, (m, lo, hi))):
                    continue
                ax2.errorbar([m], [y], xerr=[[m - lo], [hi - m]], fmt="o", color=c, capsize=3)
                labels.append(f"{n} {'signed' if key == 'bias_diff' else 'radial'}")
                y += 1
        mg = as_number(its[0].get("margin_ulp"))
    if y:
        mg = as_number(items[0].get("margin_ulp")) or 0.0
        ax2.axvspan(-mg, mg, color="#2da44e", alpha=0.2, label="margin")
        ax2.set_yticks(list(range(y)), labels, fontsize=7)
        ax2.legend(fontsize=8)
    _axes_common(ax2, {"title": "bias vs twin (ulp), interval at 1 - alpha/test", "xlabel": "ulp"})
    return _png(fig)


def _check_section(r: dict[str, Any]) -> str:
    st = r["status"]
    parts = [f'<div class="check" id="{_e(r["id"])}">',
             f'<h3><span class="st" style="background:{STATUS_COLOR.get(st, "#666")}">{_e(st.upper())}'
             f'</span> {_e(r["id"])} <span class="muted">{_e(r.get("title", ""))}</span></h3>',
             f'<div><span class="where">{_e(r.get("where") or "-")}</span> &middot; '
             f'{float(r.get("duration_s", 0.0)):.2f} s'
             + (" &middot; worker subprocess" if r.get("isolated") else "")
             + (f' &middot; tightness {_fmt(r["tightness"])}' if r.get("tightness") is not None else "")
             + f' &middot; <span class="muted">{_e(r.get("module", ""))}</span></div>',
             f"<p>{_e(r.get('summary', ''))}</p>"]
    for n in r.get("notes") or []:
        parts.append(f'<p class="note">note: {_e(n)}</p>')
    details = r.get("details") or {}
    plots = details.get("plot")
    if plots is not None:
        for p in plots if isinstance(plots, list) else [plots]:
            parts.append(render_plot(p))
    st_items = _stat_items(details.get("statistical"))
    if st_items:
        try:
            parts.append(f'<img class="plot" alt="statistical tier" src="data:image/png;base64,'
                         f'{plot_statistical(st_items)}">')
        except (ValueError, TypeError, KeyError) as e:   # a malformed entry never breaks the report
            parts.append(f'<p class="note">statistical tier plot unavailable: {_e(e)}</p>')
    metrics = r.get("metrics") or {}
    if metrics:
        parts.append(_table(["metric", "value"], [[k, v] for k, v in metrics.items()]))
    tab = details.get("table")
    if isinstance(tab, dict) and "columns" in tab:
        parts.append(render_plot({"kind": "table", **tab}))
    for key, val in details.items():
        if key in ("plot", "table", "traceback", "worker_stderr_tail", "worker_exit", "statistical"):
            continue
        t = _generic_table(val)
        if t:
            parts.append(f'<h4>{_e(key)}</h4><div class="scroll">{t}</div>')
    tb = details.get("traceback") or details.get("worker_stderr_tail")
    if tb:
        parts.append(f"<pre>{_e(tb)}</pre>")
    parts.append("</div>")
    return "\n".join(parts)


def render(report: dict[str, Any]) -> str:
    """The whole report as one HTML string."""
    results = report["results"]
    summ = report["summary"]
    code = summ["exit_code"]
    color = "#1a7f37" if code == 0 else ("#cf222e" if code in (1, 3) else "#9a6700")
    cfg = report.get("config", {})
    env = report.get("environment", {})
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>fa4verify audit: {_e(summ.get('verdict', ''))}</title>",
           f"<style>{CSS}</style></head><body>",
           "<h1>fa4verify audit</h1>",
           f'<p class="muted">{_e(report.get("created", ""))} &middot; schema {_e(report.get("schema"))}'
           f' &middot; {_e(" ".join(report.get("command") or []))}</p>',
           f'<div class="verdict" style="background:{color}">{_e(summ.get("verdict", ""))} (exit {code})</div>']
    c = summ.get("counts", {})
    out.append("<p>" + " &middot; ".join(
        f'<span class="st" style="background:{STATUS_COLOR[k]}">{c.get(k, 0)} {k}</span>'
        for k in ("pass", "fail", "error", "undecided", "skip")) +
        f" &middot; {float(summ.get('duration_s', 0.0)):.1f} s</p>")
    wc = summ.get("where") or {}
    if wc:
        out.append("<p>What ran where: " + ", ".join(
            f'<span class="where">{_e(w)}</span> {n}' for w, n in sorted(wc.items())) + "</p>")

    from fa4verify.audit.terminal import tightest, worst_ulps

    ulps = [u for u in worst_ulps(results) if "bf16" in u[1].lower()][:5]
    if ulps:
        out.append("<p>Worst errors (bf16 ulps): " + "; ".join(
            f'<a href="#{_e(i)}">{_e(i)}</a> {_e(m)} = {_e(_fmt(v))}' for i, m, v in ulps) + "</p>")
    tight = tightest(results)[:5]
    if tight:
        out.append("<p>Tightest budgets (measured / budget): " + "; ".join(
            f'<a href="#{_e(i)}">{_e(i)}</a> {_e(_fmt(t))}' for i, t in tight) + "</p>")
    bl = report.get("baseline")
    if bl:
        out.append(f"<h2>Baseline {_e(bl.get('path', ''))}</h2>")
        regs = bl.get("regressions") or []
        out.append(f"<p>{len(regs)} regression(s), {len(bl.get('improvements') or [])} improvement(s),"
                   f" missing: {_e(', '.join(bl.get('missing') or []) or '-')}, new: "
                   f"{_e(', '.join(bl.get('new') or []) or '-')}</p>")
        if regs:
            out.append(_table(["check", "metric", "baseline", "now"],
                              [[g["id"], g["metric"], g["old"], g["new"]] for g in regs]))

    out.append("<h2>Overview</h2>")
    ov = None
    try:
        ov = plot_overview(results)
    except Exception as e:  # pragma: no cover - defensive
        out.append(f'<p class="note">overview plot not drawn: {_e(e)}</p>')
    if ov:
        out.append(f'<img class="plot" alt="tightness overview" src="data:image/png;base64,{ov}">')
    order = {"fail": 0, "error": 1, "undecided": 2, "pass": 3, "skip": 4}
    rows = sorted(results, key=lambda r: (order.get(r["status"], 5), r["id"]))
    out.append("<table><tr><th>status</th><th>check</th><th>where</th><th>tightness</th>"
               "<th>time [s]</th><th>summary</th></tr>")
    for r in rows:
        st = r["status"]
        t = r.get("tightness")
        out.append(f'<tr><td><span class="st" style="background:{STATUS_COLOR.get(st, "#666")}">'
                   f'{_e(st)}</span></td><td><a href="#{_e(r["id"])}">{_e(r["id"])}</a></td>'
                   f'<td>{_e(r.get("where") or "-")}</td><td class="num">{_e("-" if t is None else _fmt(t))}</td>'
                   f'<td class="num">{float(r.get("duration_s", 0.0)):.2f}</td><td>{_e(r.get("summary", ""))}</td></tr>')
    out.append("</table>")

    out.append("<h2>Checks</h2>")
    for r in rows:
        if r["status"] == "skip":
            continue
        out.append(_check_section(r))
    skipped = [r for r in rows if r["status"] == "skip"]
    if skipped:
        out.append("<h2>Skipped</h2>")
        out.append(_table(["check", "reason"], [[r["id"], r.get("summary", "")] for r in skipped]))
    out.append("<h2>Configuration and environment</h2>")
    out.append(_table(["config", "value"], [[k, json.dumps(v) if not isinstance(v, str) else v]
                                            for k, v in cfg.items()]))
    vers = env.get("versions") or {}
    hw = env.get("hardware") or {}
    out.append(_table(["version", ""], [[k, v if v is not None else "not installed"]
                                        for k, v in vers.items()]))
    out.append(_table(["hardware", ""], [[k, v] for k, v in hw.items()]))

    out.append(f'<p class="muted">Generated by fa4verify {_e(vers.get("fa4verify", ""))}. '
               "Figures are labelled with where they were obtained: measured on H200, recorded on H200, CPU twin, "
               "compile-only or CPU.</p>")
    out.append("</body></html>")
    return "\n".join(out)
