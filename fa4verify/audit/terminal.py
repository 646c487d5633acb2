"""Terminal output of the audit: live progress on a TTY, one line per check otherwise, and the
one-screen verdict (also used by ``fa4verify report show``)."""
from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any, Iterator, Sequence

from fa4verify.audit.report_json import as_number

STATUS_STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold magenta",
                "undecided": "bold yellow", "skip": "dim"}
STATUS_LABEL = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "undecided": "UNDECIDED",
                "skip": "SKIP"}
#: A check slower than this (seconds) is listed under "slow checks" in the verdict.
SLOW_S = {"quick": 5.0, "default": 15.0, "full": 120.0, "exhaustive": 1800.0}


class TolerantStream:
    """Note [A closed stdout is not a failed audit]: stdout closed by the reader (``| head -n1``)
    or on a full device (``> /dev/full``) must not abort the audit, lose its report files or
    change its exit code. The first failed write marks the stream ``failed``, points the file
    descriptor at /dev/null (so the interpreter's final flush succeeds too) and drops the rest
    of the terminal output; everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.failed: OSError | None = None

    def _fail(self, e: OSError) -> None:
        self.failed = e
        with contextlib.suppress(Exception):
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._stream.fileno())
            os.close(fd)

    def write(self, text: str) -> int:
        if self.failed is None:
            try:
                return self._stream.write(text)
            except OSError as e:
                self._fail(e)
        return len(text)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self._stream.flush()
            except OSError as e:
                self._fail(e)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _columns() -> int | None:
    """``$COLUMNS`` when it is a usable width (rich takes 0 or garbage at face value and then
    prints nothing), else None."""
    try:
        c = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return c if 20 <= c <= 10000 else None


def make_console(file: Any = None, force_terminal: bool | None = None):
    from rich.console import Console

    f = file or TolerantStream(sys.stdout)
    is_tty = force_terminal if force_terminal is not None else bool(getattr(f, "isatty", lambda: False)())
    width = None
    if "COLUMNS" in os.environ and _columns() is None:
        width = 120 if not is_tty else 80
    elif not is_tty and "COLUMNS" not in os.environ:
        width = 120
    return Console(file=f, force_terminal=force_terminal, width=width, highlight=False,
                   soft_wrap=False)


def _fmt_num(v: Any) -> str:
    x = as_number(v)
    if x is None:
        return str(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.4g}"


class TerminalReporter:
    """Implements :class:`fa4verify.audit.runner.Reporter` with rich."""

    def __init__(self, console=None, *, live: bool | None = None) -> None:
        self.console = console or make_console()
        self.live = self.console.is_terminal if live is None else live
        self._progress = None
        self._overall = None
        self._n = 0
        self._i = 0

    # -- Reporter protocol
    def start(self, selected: Sequence[Any], config: Any) -> None:
        self._n = len(selected)
        where = "CUDA device" if config.device == "cuda" else "CPU (twins + compile-only)"
        if getattr(config, "fake_device", None):      # Note [Fake device audit]
            from fa4verify.kernels.device import FAKE_DEVICES
            where = f"a fake {FAKE_DEVICES[config.fake_device].label} (CPU checks + compile-only)"
        self.console.print(f"[bold]fa4verify audit[/] dtype={config.dtype} profile={config.profile} "
                           f"device={config.device} archs={','.join(config.archs)} seed={config.seed}"
                           + (f" shard={config.shard[0]}/{config.shard[1]}" if config.shard else "")
                           + f" -- {self._n} check(s) on {where}")
        if self.live and self._n:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=self.console, transient=True)
            self._progress.start()
            self._overall = self._progress.add_task("audit", total=self._n)

    def check_started(self, sel: Any) -> None:
        if self._progress is not None:
            self._progress.update(self._overall, description=f"audit: {_escape(sel.id)}")

    def progress_factory(self, sel: Any):
        prog = self._progress
        if prog is None:
            return None

        @contextlib.contextmanager
        def factory(total: float | None, description: str = "") -> Iterator[Any]:
            task = prog.add_task(f"  {_escape(description or sel.id)}", total=total)

            class _Handle:
                def advance(self, n: float = 1) -> None:
                    prog.advance(task, n)

                def update(self, description: str | None = None, **kw: Any) -> None:
                    if description is not None:
                        kw["description"] = f"  {_escape(description)}"
                    kw = {k: v for k, v in kw.items() if k in ("description", "completed",
                                                               "total", "advance")}
                    prog.update(task, **kw)

            try:
                yield _Handle()
            finally:
                prog.remove_task(task)

        return factory

    def check_finished(self, rec: Any) -> None:
        self._i += 1
        r = rec.result
        st = r.status
        w = len(str(self._n))
        line = (f"[{self._i:>{w}}/{self._n}] [{STATUS_STYLE[st]}]{STATUS_LABEL[st]:<5}[/] "
                f"{_escape(rec.id)}  [cyan]{_escape(r.where or '-')}[/]  {rec.duration_s:.1f}s"
                + ("  (worker)" if rec.isolated else "") + f"  {_escape(r.summary)}")
        self.console.print(line, overflow="fold")
        if self._progress is not None:
            self._progress.advance(self._overall, 1)

    def finish(self, run: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def coverage_block(check_id: str, where: str, cov: dict[str, Any], space: dict[str, Any]):
    """The coverage matrix of a planned check (``details["plan_coverage"]``, fa4verify.coverage): per
    dimension its values and the pairs covered / supported, the planned triples, the
    holes by name and how many tuples are not planned (FA4 or fa4verify does not run them)."""
    from rich.table import Table
    tab = Table(title=f"coverage by construction: {_escape(check_id)} ({_escape(where)})", title_justify="left",
                caption=(f"{cov['covered']}/{cov['supported']} supported tuples covered in {cov['rows']} rows; "
                         f"{len(cov.get('unsupported', {}))} tuples not planned (the installed FA4 or fa4verify does not run them) "
                         f"(listed in the JSON/HTML report)"))
    tab.add_column("dimension")
    tab.add_column("values")
    tab.add_column("pairs covered", justify="right")
    tab.add_column("not supported", justify="right")
    dims = space.get("dimensions") or {}
    per = cov.get("per_group") or {}
    uns = cov.get("unsupported_per_group") or {}
    for d, vals in dims.items():
        got = sum(c["covered"] for g, c in per.items() if d in g.split(" x ") and g.count(" x ") == 1)
        sup = sum(c["supported"] for g, c in per.items() if d in g.split(" x ") and g.count(" x ") == 1)
        un = sum(n for g, n in uns.items() if d in g.split(" x ") and g.count(" x ") == 1)
        tab.add_row(d, _escape(" ".join(map(str, vals))), f"{got}/{sup}", str(un))
    for g, c in per.items():
        if g.count(" x ") >= 2:
            tab.add_row(_escape(g), "(triples)", f"{c['covered']}/{c['supported']}", str(uns.get(g, 0)))
    holes = cov.get("holes") or []
    if holes:
        tab.add_row("[red]holes[/]", _escape("; ".join(holes[:5]) + (f" (+{len(holes) - 5})" if len(holes) > 5 else "")),
                    str(len(holes)), "")
    return tab


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(obj: Any) -> Any:
    """Note [No raw control bytes on the terminal]: every string of ``obj`` (dicts and lists
    walked) with its control characters -- ESC, newline, BEL, C1 -- written as escapes
    (``\\x1b``, ``\\n``): a report or a name is data, and a crafted one must not move the
    cursor, clear the screen or draw a fake PASS row."""
    if isinstance(obj, str):
        return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), obj)
    if isinstance(obj, dict):
        return {printable(k): printable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(printable(v) for v in obj)
    return obj


def _escape(s: str) -> str:
    """Rich markup escaped and control characters made visible (Note [No raw control bytes on the
    terminal])."""
    from rich.markup import escape

    return escape(printable(s or ""))


def render_verdict(report: dict[str, Any], console=None, *, max_rows: int = 25) -> None:
    """Print the one-screen verdict of a report dict (``fa4verify.audit/1``)."""
    from rich.panel import Panel
    from rich.table import Table

    con = console or make_console()
    report = printable(report)      # Note [No raw control bytes on the terminal]
    results = report["results"]
    summ = report["summary"]
    code = summ["exit_code"]
    cfg = report.get("config", {})
    profile = cfg.get("profile", "default")

    tab = Table(title="checks", show_lines=False, expand=False, title_justify="left")
    tab.add_column("status")
    tab.add_column("check")
    tab.add_column("where", style="cyan")
    tab.add_column("tight", justify="right")
    tab.add_column("time", justify="right")
    tab.add_column("summary", overflow="fold", max_width=70)
    order = {"fail": 0, "error": 1, "undecided": 2, "pass": 3, "skip": 4}
    shown = sorted(results, key=lambda r: (order.get(r["status"], 5), r["id"]))
    hidden = 0
    if len(shown) > max_rows:
        # one screen: every non-pass, then the tightest passes; skips are summarised below
        bad = [r for r in shown if r["status"] in ("fail", "error", "undecided")]
        passes = sorted((r for r in shown if r["status"] == "pass"),
                        key=lambda r: -(as_number(r.get("tightness")) or -1.0))
        keep = bad + passes[:max(0, max_rows - len(bad))]
        hidden = len(shown) - len(keep)
        shown = keep
    for r in shown:
        t = r.get("tightness")
        tab.add_row(f"[{STATUS_STYLE[r['status']]}]{STATUS_LABEL[r['status']]}[/]", _escape(r["id"]),
                    r.get("where") or "-", "-" if t is None else f"{float(as_number(t) or 0):.3g}",
                    f"{float(r.get('duration_s', 0.0)):.1f}s", _escape(r.get("summary", "")))
    if hidden:
        tab.caption = (f"{hidden} more not shown (loosest passes and skips; see the lines above "
                       "and the JSON/HTML report)")
    con.print(tab)

    for r in results:
        cov = (r.get("details") or {}).get("plan_coverage")
        if cov:
            con.print(coverage_block(r["id"], r.get("where") or "", cov,
                                     ((r.get("details") or {}).get("plan") or {}).get("space") or {}))

    lines: list[str] = []
    c = summ["counts"]
    lines.append("  ".join(f"[{STATUS_STYLE[k]}]{c.get(k, 0)} {k}[/]"
                           for k in ("pass", "fail", "error", "undecided", "skip")))
    st = (report.get("environment") or {}).get("stack")
    if st:   # the FA4 release audited, and whether its stack is the one its metadata names
        from fa4verify.audit.environment import stack_line
        sl = _escape(stack_line(st))
        lines.append(f"[yellow]{sl}[/]" if st.get("mismatch") else sl)
    wc = summ.get("where") or {}
    if wc:
        lines.append("ran: " + ", ".join(f"{n} {w}" for w, n in sorted(wc.items())))
    ulps = worst_ulps(results)
    bf16 = [u for u in ulps if "bf16" in u[1].lower()]
    other = [u for u in ulps if "bf16" not in u[1].lower()]
    if bf16:
        lines.append("worst errors (bf16 ulps): " + "; ".join(
            f"{_escape(i)} {_escape(m)}={_fmt_num(v)}" for i, m, v in bf16[:5]))
    if other:
        lines.append("[dim]other ulp metrics: " + "; ".join(
            f"{_escape(i)} {_escape(m)}={_fmt_num(v)}" for i, m, v in other[:3]) + "[/]")
    tight = tightest(results)
    if tight:
        lines.append("tightest budgets (measured/budget): " + "; ".join(
            f"{_escape(i)} {t:.3g}" for i, t in tight[:5]))
    skips: dict[str, list[str]] = {}
    for r in results:
        if r["status"] == "skip":
            skips.setdefault(r.get("summary") or "no reason given", []).append(r["id"])
    for reason, ids in sorted(skips.items(), key=lambda kv: -len(kv[1])):
        more = f" (+{len(ids) - 3})" if len(ids) > 3 else ""
        lines.append(f"[dim]skipped {len(ids)}: {_escape(reason)} -- {_escape(', '.join(ids[:3]))}{more}[/]")
    slow_s = SLOW_S.get(profile, 15.0)
    slow = [(r["id"], float(r.get("duration_s", 0))) for r in results
            if float(r.get("duration_s", 0)) > slow_s]
    if slow:
        lines.append(f"[yellow]slow (> {slow_s:g} s in profile {profile}): "
                     + ", ".join(f"{_escape(i)} {d:.0f}s" for i, d in sorted(slow, key=lambda x: -x[1])) + "[/]")
    bl = report.get("baseline")
    if bl:
        regs = bl.get("regressions") or []
        lines.append(f"baseline {bl.get('path', '')}: {len(regs)} regression(s), "
                     f"{len(bl.get('improvements') or [])} improvement(s), "
                     f"{len(bl.get('missing') or [])} missing, {len(bl.get('new') or [])} new")
        if bl.get("undecided"):
            lines.append(f"  [yellow]UNDECIDED: the baseline compared nothing: {_escape(str(bl['undecided']))}[/]")
        for g in regs[:10]:
            lines.append(f"  [red]REGRESSION[/] {_escape(g['id'])} {_escape(str(g['metric']))}: {_fmt_num(g['old'])} -> "
                         f"{_fmt_num(g['new'])}")
        for m in bl.get("mismatch") or []:
            lines.append(f"  [yellow]config differs from baseline: {_escape(m)}[/]")
    lines.append(f"total {float(summ.get('duration_s', 0)):.1f} s")
    style = "green" if code == 0 else ("red" if code in (1, 3) else "yellow")
    con.print(Panel("\n".join(lines), title=f"[bold {style}]{_escape(str(summ.get('verdict', '')))} "
                    f"(exit {code})[/]", border_style=style, expand=False))


def worst_ulps(results: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """(id, metric, value) for metrics in ulps (name contains "ulp"), largest first."""
    out = []
    for r in results:
        if r["status"] == "skip":
            continue
        for k, v in (r.get("metrics") or {}).items():
            if "ulp" in k.lower() and not k.endswith("_higher_is_better"):
                x = as_number(v)
                if x is not None and x == x:
                    out.append((r["id"], k, x))
    out.sort(key=lambda t: -t[2])
    return out


def tightest(results: Sequence[dict[str, Any]]) -> list[tuple[str, float]]:
    out = []
    for r in results:
        t = as_number(r.get("tightness"))
        if t is not None and t == t and r["status"] != "skip":
            out.append((r["id"], t))
    out.sort(key=lambda t: -t[1])
    return out
