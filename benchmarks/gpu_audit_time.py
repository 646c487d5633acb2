#!/usr/bin/env python3
"""Wall time of the GPU audit, per check, cold and warm, in one run.

Runs ``fa4verify audit --dtype bf16 --device cuda --seed 0 --profile P --json ...`` as
subprocesses in these modes (``--modes``, comma-separated, in order):

* ``before``        ``--workers 1 --fresh-workers --kernel-cache off``: a new worker process per
                    isolated check, no compiled-kernel reuse (the runner of session 3);
* ``cold``          the defaults (``--workers auto``, persistent workers, FA4's kernel cache, the
                    engine's tasks: a check's cases grouped by compile key) with an empty cache;
* ``warm``          the defaults again with the cache ``cold`` filled (a second audit).
* ``kernels-cold``  the defaults with an empty FA4 kernel cache but the bytecode cache an earlier
                    mode filled (Note [Bytecode cache]): a first audit on a machine whose Python
                    already has bytecode for torch and FA4, as ``pip install`` leaves it.

With timing in the reports (``CheckRecord.timing``) it also prints, per mode, where the time
went (worker start-ups, FA4 kernel compiles and disk-cache loads, each worker's busy seconds, the
critical item) and writes a timeline chart per mode (``audit_<profile>_<mode>_timeline.png``).
It prints one table: per check the seconds and verdict of every mode and, for modes where the
check ran as several tasks, the slowest task and the task count (``max/k``: the check's share of
the critical path); then per mode the audit's wall time, its largest work item, the exit code and
verdict counts. ``--recorded LABEL=FILE`` (repeatable) adds a column from an earlier JSON
report (e.g. ``last-cold=docs/results/h200/audit_time/audit_default_cold.json``). The verdicts of the modes must agree (it says so when they
do not). Usage::

    python3 benchmarks/gpu_audit_time.py --profile default --modes cold,warm --out DIR \\
        --recorded last-cold=docs/results/h200/audit_time/audit_default_cold.json
    python3 benchmarks/gpu_audit_time.py --profile quick --modes cold,warm --out DIR

``--against DIR`` then times this tree against another commit's (its tree in DIR): warm audits
of each in turn, ``--rounds`` times, on the kernel cache the modes filled, on the same machine.

``--dry-run`` runs every mode on the CPU (``--device cpu``, the CPU checks only) to test the
script itself.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

MODES = {
    "before": ["--workers", "1", "--fresh-workers", "--kernel-cache", "off"],
    "cold": [],
    "warm": [],
    "kernels-cold": [],
}


def _cache_for(mode: str, modes: Sequence[str], caches: dict[str, str]) -> str | None:
    """The kernel-cache directory of ``mode``: cold and warm share one, ``kernels-cold`` has its own
    (empty) one beside it, so it shares their bytecode cache; ``before`` has none."""
    if mode == "before":
        return None
    return caches["kernels-cold" if mode == "kernels-cold" else "shard"]


def run_mode(mode: str, profile: str, out_dir: str, cache: str | None, extra: list[str],
             timeout: float, device: str = "cuda", label: str | None = None, cwd: str | None = None) -> dict:
    """One audit of ``mode`` (its report and log named by ``label``, default the mode), run in
    ``cwd`` (its ``.fa4verify-commit``, where it has one, names the commit in the report)."""
    label = label or mode
    out_dir = os.path.abspath(out_dir)            # the audit may run in another directory (cwd)
    cache = None if cache is None else os.path.abspath(cache)
    js = os.path.join(out_dir, f"audit_{profile}_{label}.json")
    args = [sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "--device", device,
            "--seed", "0", "--profile", profile, "--no-live", "--json", js, *MODES[mode], *extra]
    if cache is not None:
        args += ["--kernel-cache", cache]
    env = dict(os.environ)
    if cwd is not None:       # another tree: its own stamp, or none (never this tree's)
        env.pop("FA4VERIFY_GIT_COMMIT", None)
        stamp = os.path.join(cwd, ".fa4verify-commit")
        if os.path.isfile(stamp):
            with open(stamp) as f:
                env["FA4VERIFY_GIT_COMMIT"] = f.read().strip()
    for k in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "PYTHONPYCACHEPREFIX"):
        env.pop(k, None)          # the audit's own --kernel-cache decides
    # fa4verify's bytecode cache (Note [Bytecode cache]) beside the kernel cache: a
    # cold run starts with all of them empty, warm finds what cold left
    env["FA4VERIFY_CACHE_DIR"] = (os.path.join(os.path.dirname(os.path.abspath(cache)), "fa4verify-cache")
                                  if cache is not None else tempfile.mkdtemp(prefix="fa4verify-cache-"))
    t0 = time.perf_counter()
    with open(os.path.join(out_dir, f"audit_{profile}_{label}.log"), "w") as log:
        try:
            rc: Any = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     timeout=timeout, cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    rep = {}
    if os.path.exists(js):
        with open(js) as f:
            rep = json.load(f)
    return {"mode": label, "rc": rc, "wall_s": wall, "report": rep}


def install(tree: str) -> None:
    """``pip install -e tree`` offline (the lent GPU machine has no package index)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-e", tree], check=True, stdout=subprocess.DEVNULL)


def against(other: str, rounds: int, profile: str, out_dir: str, cache: str, extra: list[str], timeout: float,
            device: str) -> list[dict]:
    """Warm audits of this tree and of ``other`` (another commit's tree) alternating, ``rounds``
    times each, on one kernel cache and one machine: the only fair comparison of two commits'
    audit times (lent machines of one kind differ; one of them compiled FA4's kernels 20 % faster
    than another, 2026-12-05). Each audit runs the tree ``pip install -e`` put in place; this
    tree is installed again at the end."""
    here = str(Path(__file__).resolve().parents[1])
    runs = []
    # a SIGTERM (gpu.sh runs this under `timeout`) must still reinstall this tree: the finally below
    # runs only if the signal ends the script through an exception
    old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for r in range(1, rounds + 1):
            for name, tree in (("this", here), ("other", os.path.abspath(other))):
                install(tree)
                runs.append(run_mode("warm", profile, out_dir, cache, extra, timeout, device=device,
                                     label=f"warm-{name}-{r}", cwd=tree))
                print(f"[warm-{name}-{r}] exit {runs[-1]['rc']} in {runs[-1]['wall_s']:.1f} s", flush=True)
    finally:
        install(here)
        signal.signal(signal.SIGTERM, old_term)
    return runs


def _gpu_name(rep: dict) -> str | None:
    hw = rep.get("environment", {}).get("hardware", {}) or {}
    g = hw.get("gpu_name") or hw.get("gpu")
    if isinstance(g, list):
        g = g[0] if g else None
    if isinstance(g, dict):
        g = g.get("name")
    return g


def per_check(rep: dict) -> dict[str, dict[str, Any]]:
    """check id -> {"s": wall seconds, "status", "tasks": its task count when > 1 (else 0),
    "max_task_s": its slowest task's seconds or None}."""
    out = {}
    for r in rep.get("results", []):
        sh = [t for t in (r.get("timing") or []) if "start_s" in t and "end_s" in t]
        many = len(sh) > 1
        out[r["id"]] = {"s": float(r.get("duration_s", 0.0)), "status": r.get("status", "?"),
                        "tasks": len(sh) if many else 0,
                        "max_task_s": max(t["end_s"] - t["start_s"] for t in sh) if many else None}
    return out


def largest_item(table: dict[str, dict[str, Any]]) -> tuple[str, float]:
    """The longest task of an audit: a check's slowest task, or the check if it was one."""
    best = ("-", 0.0)
    for cid, v in table.items():
        s = v["max_task_s"] if v["max_task_s"] is not None else v["s"]
        if s > best[1]:
            best = (cid + (f" (1 of {v['tasks']} tasks)" if v["tasks"] else ""), s)
    return best


def format_table(cols: Sequence[tuple[str, dict]], walls: Sequence[float | None], *, profile: str,
                 gpu: str | None) -> tuple[list[str], dict[str, Any]]:
    """The printed lines and the JSON summary for reports ``cols`` = [(label, report)] with
    audit walls ``walls`` (None for a recorded column)."""
    tables = [per_check(rep) for _, rep in cols]
    split = [any(v["tasks"] for v in t.values()) for t in tables]
    ids = list(dict.fromkeys(i for t in tables for i in t))
    lines = [f"fa4verify audit --profile {profile}: wall seconds per check (measured on "
             f"{gpu or 'the local GPU'}; 'max/k' = the slowest of the check's k tasks)"]
    head = f"{'check':40s}" + "".join(f"{name:>14s}" + (f"{'max/k':>10s}" if sh else "")
                                     for (name, _), sh in zip(cols, split))
    lines += [head, "-" * len(head)]
    for i in ids:
        row = f"{i:40s}"
        for t, sh in zip(tables, split):
            v = t.get(i)
            row += f"{'-':>14s}" if v is None else f"{v['s']:10.1f} {v['status'][:3]:>3s}"
            if sh:
                row += (f"{v['max_task_s']:7.1f}/{v['tasks']:<2d}" if v and v["tasks"] else f"{'':10s}")
        lines.append(row)
    lines.append("-" * len(head))
    lines.append(f"{'audit wall (s)':40s}" + "".join(
        (f"{'':>14s}" if w is None else f"{w:14.1f}") + ("" if not sh else f"{'':10s}")
        for w, sh in zip(walls, split)))
    summary: dict[str, Any] = {"profile": profile, "gpu": gpu, "modes": {}}
    for (name, rep), t, w in zip(cols, tables, walls):
        s = rep.get("summary", {})
        big, big_s = largest_item(t)
        workers = (rep.get("config") or {}).get("workers")
        lines.append(f"  {name:13s} exit {s.get('exit_code')} workers {workers} counts {s.get('counts')}; "
                     f"largest item {big} {big_s:.1f} s")
        tl_lines, tl = timeline(rep, w)
        if tl:
            lines += tl_lines
        summary["modes"][name] = {"wall_s": w, "exit_code": s.get("exit_code"), "counts": s.get("counts"),
                                  "workers": workers, "largest_item": [big, round(big_s, 2)],
                                  "per_check": t, "timeline": tl}
    common = set(ids).intersection(*[set(t) for t in tables]) if tables else set()
    differ = [i for i in ids if i in common and len({t[i]["status"] for t in tables}) > 1]
    agree = not differ
    only = [i for i in ids if i not in common]
    lines.append("verdicts of every mode agree" + (f" (on the {len(common)} checks every column has)" if only else "")
                 if agree else f"VERDICTS DIFFER between modes: {', '.join(differ)}")
    summary["verdicts_agree"] = agree
    summary["verdicts_differ"] = differ
    summary["checks_not_in_every_column"] = only
    return lines, summary


def _items(rep: dict) -> list[dict[str, Any]]:
    """Every work item of a report with its timing (``CheckRecord.timing``): id, lane (worker
    pid, or "parent" for in-process checks), start/end from the audit's start and the worker's
    figures."""
    out = []
    for r in rep.get("results", []):
        tasks = r.get("timing") or []
        for j, t in enumerate(tasks):
            label = r["id"] + (f"[{j + 1}/{len(tasks)}]" if len(tasks) > 1 else "")
            out.append(dict(t, id=label, check=r["id"], lane=str(t.get("pid", "parent" if not r.get("isolated") else "?"))))
    return sorted(out, key=lambda t: t.get("start_s", 0.0))


def timeline(rep: dict, wall: float | None) -> tuple[list[str], dict[str, Any]]:
    """Where an audit's seconds went: worker start-ups, FA4 compiles and cache loads, each
    worker's busy share, and the critical item (the one that ended last)."""
    items = _items(rep)
    if not items:
        return ["    (no timing in this report)"], {}
    iso = [t for t in items if t["lane"] != "parent"]
    starts = [t["worker_start_s"] for t in iso if "worker_start_s" in t]
    waits = [t.get("worker_wait_s", 0.0) for t in iso if "worker_start_s" in t]
    pre: dict[str, list[float]] = {}
    for t in iso:
        for k, v in (t.get("preload") or {}).items():
            pre.setdefault(k, []).append(float(v))
    comp = sum(t.get("compiles", 0) for t in iso)
    comp_s = sum(t.get("compile_s", 0.0) for t in iso)
    comp_cpu = sum(t.get("compile_cpu_s", 0.0) for t in iso)
    loads = sum(t.get("loads", 0) for t in iso)
    load_s = sum(t.get("load_s", 0.0) for t in iso)
    exec_s = sum(t.get("exec_s", 0.0) for t in iso)
    end = max(t.get("end_s", 0.0) for t in items)
    lanes: dict[str, list[dict]] = {}
    for t in items:
        lanes.setdefault(t["lane"], []).append(t)
    busy = {ln: sum(t["end_s"] - t["start_s"] for t in ts) for ln, ts in lanes.items()}
    last = max(items, key=lambda t: t.get("end_s", 0.0))
    lines = []
    if starts:
        lines.append(f"    worker start-up: {len(starts)} workers, {max(starts):.1f} s max, "
                     f"{sum(starts) / len(starts):.1f} s mean (preload "
                     + ", ".join(f"{k} {sum(v) / len(v):.1f}" for k, v in pre.items())
                     + f"); first items waited {max(waits, default=0.0):.1f} s at most")
    cpu = f" ({comp_cpu:.1f} CPU s in the compiling processes)" if comp_cpu else ""
    waits = sum(t.get("waits", 0) for t in iso)
    wait_s = sum(t.get("wait_s", 0.0) for t in iso)
    if waits:      # Note [One compile per key per audit] (fa4verify.audit.kernel_timing)
        cpu += f"; {waits} waits for another worker's compile of the same key ({wait_s:.1f} s)"
    lines.append(f"    FA4 kernels: {comp} compiled in {comp_s:.1f} s{cpu}, {loads} loaded from the disk "
                 f"cache in {load_s:.1f} s; worker exec {exec_s:.1f} s in all")
    lines.append(f"    busy: " + ", ".join(f"{ln if ln == 'parent' else 'w' + str(j)} {b:.0f}/{end:.0f} s"
                                          for j, (ln, b) in enumerate(sorted(busy.items()))))
    # how far the wall is from what the work allows: the workers' execution time spread evenly
    # over them after the slowest start-up (approximate: the workers start at different times),
    # and the compiles alone the same way
    n = len({t["lane"] for t in iso})
    bound = None
    if n and exec_s:
        bound = max(starts, default=0.0) + exec_s / n
        lines.append(f"    spread evenly: {exec_s:.0f} s of worker execution / {n} workers after the slowest "
                     f"start-up ({max(starts, default=0.0):.1f} s) = {bound:.1f} s; the items end at {end:.1f} s"
                     + (f"; the compiles alone {comp_cpu / n:.1f} s" if comp_cpu else ""))
    per: dict[str, list[float]] = {}
    for t in iso:
        for k in t.get("kernels") or ():
            if k[0] == "compile":
                per.setdefault(str(k[1]), []).append(float(k[3]))
    if per:
        lines.append("    compile seconds per kernel: " + ", ".join(
            f"{c} {len(v)} x {sum(v) / len(v):.2f} s" for c, v in sorted(per.items(), key=lambda cv: -sum(cv[1]))))
    ph = (rep.get("summary") or {}).get("phases") or {}
    if ph:
        lines.append("    parent: " + ", ".join(f"{k} {float(v):.1f} s" for k, v in ph.items()))
    lines.append(f"    critical item: {last['id']} {last['start_s']:.1f}-{last['end_s']:.1f} s"
                 f" (compile {last.get('compile_s', 0.0):.1f} s, worker wait {last.get('worker_wait_s', 0.0):.1f} s)"
                 + (f"; audit wall {wall:.1f} s (process start and reports: {wall - end:.1f} s)" if wall else ""))
    ex_lines, ex_info = example_split(rep)
    lines.extend(ex_lines)
    key_lines, key_info = key_sharing(items)
    lines.extend(key_lines)
    info = {"worker_start_s": starts, "preload_mean_s": {k: sum(v) / len(v) for k, v in pre.items()},
            "kernel_keys": key_info,
            "compiles": comp, "compile_s": round(comp_s, 2), "compile_cpu_s": round(comp_cpu, 2),
            "waits": waits, "wait_s": round(wait_s, 2), "loads": loads, "load_s": round(load_s, 2),
            "exec_s": round(exec_s, 2), "items_end_s": round(end, 2), "busy_s": busy,
            "spread_evenly_s": None if bound is None else round(bound, 2),
            "compile_s_per_kernel": {c: round(sum(v) / len(v), 3) for c, v in per.items()},
            "critical_item": {k: last.get(k) for k in ("id", "start_s", "end_s", "compile_s", "worker_wait_s")},
            "parent_phases": ph, "examples": ex_info}
    return lines, info


def example_split(rep: dict, top: int = 5) -> tuple[list[str], dict[str, Any]]:
    """The campaign checks' examples (``details.example_seconds``): their seconds in the target's
    calls (FA4, the adapter, the transfers) against the rest (the judge), and the slowest ones."""
    rows = []
    for r in rep.get("results", []):
        det = r.get("details") or {}
        es = det.get("example_seconds") or {}
        edges = list(((det.get("plan_coverage") or {}).get("edge_cases") or {}))
        n_rows = int((det.get("plan") or {}).get("rows", 0) or 0)
        for i, (tot, tgt) in es.items():
            j = int(i)
            name = edges[j - n_rows] if edges and j >= n_rows and j - n_rows < len(edges) else f"#{j}"
            rows.append((float(tot), float(tgt), f"{r['id']}[{name}]"))
    if not rows:
        return [], {}
    tot, tgt = sum(x[0] for x in rows), sum(x[1] for x in rows)
    slow = sorted(rows, reverse=True)[:top]
    lines = [f"    examples: {len(rows)} in {tot:.1f} s, {tgt:.1f} s of it in the target's calls, "
             f"{tot - tgt:.1f} s in the judge; slowest: "
             + ", ".join(f"{n} {a:.1f} s ({b:.1f} target)" for a, b, n in slow)]
    return lines, {"examples": len(rows), "seconds": round(tot, 2), "target_s": round(tgt, 2),
                   "slowest": [{"example": n, "seconds": round(a, 3), "target_s": round(b, 3)} for a, b, n in slow]}


def key_sharing(items: list[dict]) -> tuple[list[str], dict[str, Any]]:
    """Note [Compile keys in the timeline] (fa4verify.audit.kernel_timing): which FA4 compile
    keys the audit's work items compiled and loaded. A key compiled by two items is one kernel
    compiled twice (two workers at once, before either stored it); a key loaded by an item after
    another compiled it is a saving; per check, the keys it shares with other checks."""
    compiled: dict[str, list[str]] = {}
    loaded: dict[str, list[str]] = {}
    check_of: dict[str, str] = {}      # work item label -> its check
    text: dict[str, str] = {}
    cache_of: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for t in items:
        for kind, cache, dg, sec, txt in t.get("kernels") or []:
            if kind not in ("compile", "load"):      # "wait": Note [One compile per key per audit]
                continue
            (compiled if kind == "compile" else loaded).setdefault(dg, []).append(t["id"])
            check_of[t["id"]] = t.get("check", t["id"])
            cache_of[dg] = cache
            if txt:
                text[dg] = txt
            if kind == "compile":
                seconds[dg] = seconds.get(dg, 0.0) + float(sec)
    if not compiled and not loaded:
        return [], {}
    n_comp = sum(len(v) for v in compiled.values())
    twice = {dg: v for dg, v in compiled.items() if len(v) > 1}
    reuse = sum(len(v) for dg, v in loaded.items() if dg in compiled)
    per_check: dict[str, set[str]] = {}
    for dg, v in list(compiled.items()) + list(loaded.items()):
        for i in v:
            per_check.setdefault(check_of[i], set()).add(dg)
    for t in items:                     # keys found in memory (hits) count for their check too
        for dg in t.get("used") or []:
            per_check.setdefault(t.get("check", t["id"]), set()).add(dg)
    users = {dg: {c for c, ks in per_check.items() if dg in ks} for ks in per_check.values() for dg in ks}
    by_cache: dict[str, int] = {}
    for dg in compiled:
        by_cache[cache_of[dg]] = by_cache.get(cache_of[dg], 0) + 1
    lines = [f"    compile keys: {len(compiled)} distinct compiled ({n_comp} compiles; "
             f"{n_comp - len(compiled)} repeated a key another item compiled, "
             f"{sum(seconds[d] for d in twice):.1f} s on twice-compiled keys), {reuse} loads of a key "
             f"compiled in this run; by cache: "
             + ", ".join(f"{k} {v}" for k, v in sorted(by_cache.items()))]
    rows = []
    for c, ks in sorted(per_check.items(), key=lambda kv: -len(kv[1])):
        shared = sum(1 for dg in ks if len(users[dg]) > 1)
        rows.append(f"{c} {len(ks)} keys ({shared} shared)")
    lines.append("    keys per check: " + ", ".join(rows))
    info = {"distinct_compiled": len(compiled), "compiles": n_comp, "twice": len(twice),
            "reuse_loads": reuse, "by_cache": by_cache,
            "keys": {dg: {"cache": cache_of[dg], "compiled_by": compiled.get(dg, []),
                          "loaded_by": loaded.get(dg, []), "compile_s": round(seconds.get(dg, 0.0), 3),
                          "text": text.get(dg, "")}
                     for dg in sorted(set(compiled) | set(loaded))}}
    return lines, info


def plot_timeline(rep: dict, path: str, title: str) -> bool:
    """A Gantt chart of the audit's work items per worker (matplotlib; False without it)."""
    items = _items(rep)
    if not items:
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    lanes = sorted({t["lane"] for t in items}, key=lambda x: (x != "parent", x))
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(lanes) + 1.5))
    for y, ln in enumerate(lanes):
        for t in (t for t in items if t["lane"] == ln):
            s0, s1 = t["start_s"], t["end_s"]
            ws = min(t.get("worker_wait_s", 0.0), s1 - s0)
            cs = min(t.get("compile_s", 0.0), s1 - s0 - ws)
            ax.barh(y, ws, left=s0, color="#bbbbbb", edgecolor="none")
            ax.barh(y, cs, left=s0 + ws, color="#e07b39", edgecolor="none")
            ax.barh(y, s1 - s0 - ws - cs, left=s0 + ws + cs, color="#3b7dd8", edgecolor="white", lw=0.5)
            if s1 - s0 > 3:
                ax.text(s0 + 0.3, y, t["id"].split(".")[-1][:22], va="center", fontsize=6, color="black")
    ax.set_yticks(range(len(lanes)), [ln if ln == "parent" else f"worker {j}" for j, ln in enumerate(lanes)])
    ax.set_xlabel("seconds from the audit's start (grey: worker start-up, orange: FA4 compiles, blue: the rest)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _recorded(spec: str) -> tuple[str, str]:
    label, sep, path = spec.partition("=")
    return (label, path) if sep else ("recorded", spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="default", choices=("quick", "default", "full"))
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--out", default=None, help="directory for the JSON reports and logs")
    ap.add_argument("--recorded", action="append", default=[], metavar="[LABEL=]FILE",
                    help="an earlier JSON report to add as a column (repeatable)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-audit limit (s)")
    ap.add_argument("--cache-root", default=None,
                    help="keep the kernel cache under DIR/shard (default: a new temporary directory); "
                         "a filled DIR makes 'cold' warm, so give an empty one for a cold run")
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="after the modes, warm audits of this tree and of DIR (another commit's tree) "
                         "alternating on the modes' kernel cache (pip install -e of each in turn)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of --against (default 2)")
    ap.add_argument("--dry-run", action="store_true", help="run on the CPU (--device cpu) to test the script")
    ap.add_argument("extra", nargs="*", help="extra audit arguments (after --)")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"error: unknown mode(s) {bad}; choose from {list(MODES)}", file=sys.stderr)
        return 2
    if a.against and not os.path.isfile(os.path.join(a.against, "pyproject.toml")):
        print(f"error: --against {a.against}: no project tree there (pyproject.toml)", file=sys.stderr)
        return 2
    if a.against and not {"cold", "warm"} & set(modes):
        print("error: --against needs a cold or warm mode first (its audits run on the kernel cache those fill)",
              file=sys.stderr)
        return 2
    recorded = [_recorded(r) for r in a.recorded]
    for _, path in recorded:
        if not os.path.isfile(path):
            print(f"error: --recorded {path}: no such file", file=sys.stderr)
            return 2
    out = a.out or tempfile.mkdtemp(prefix="fa4verify-audit-time-")
    os.makedirs(out, exist_ok=True)
    if a.cache_root:
        caches = {"shard": os.path.join(a.cache_root, "shard"),
                  "kernels-cold": os.path.join(a.cache_root, "shard-kernels-cold")}
        for c in caches.values():
            os.makedirs(c, exist_ok=True)
    else:
        root = tempfile.mkdtemp(prefix="fa4verify-kernel-cache-")
        caches = {"shard": os.path.join(root, "shard"), "kernels-cold": os.path.join(root, "shard-kernels-cold")}
        for c in caches.values():
            os.makedirs(c)
    device = "cpu" if a.dry_run else "cuda"
    runs = []
    for m in modes:
        r = run_mode(m, a.profile, out, _cache_for(m, modes, caches), a.extra, a.timeout, device=device)
        print(f"[{m}] exit {r['rc']} in {r['wall_s']:.1f} s", flush=True)
        runs.append(r)
    if a.against:
        runs += against(a.against, a.rounds, a.profile, out, caches["shard"], a.extra, a.timeout, device)
    cols: list[tuple[str, dict]] = []
    walls: list[float | None] = []
    for label, path in recorded:
        with open(path) as f:
            cols.append((label, json.load(f)))
        walls.append(None)
    cols += [(r["mode"], r["report"]) for r in runs]
    walls += [r["wall_s"] for r in runs]
    gpu = next((_gpu_name(rep) for _, rep in cols if _gpu_name(rep)), None)
    lines, summary = format_table(cols, walls, profile=a.profile, gpu=gpu)
    print("\n".join(lines))
    for r in runs:
        plot_timeline(r["report"], os.path.join(out, f"audit_{a.profile}_{r['mode']}_timeline.png"),
                      f"fa4verify audit --profile {a.profile} ({r['mode']}) on {gpu or 'the local GPU'}: "
                      f"{r['wall_s']:.1f} s")
    summary["runs"] = [{k: v for k, v in r.items() if k != "report"} for r in runs]
    summary["recorded"] = dict(recorded)
    with open(os.path.join(out, f"audit_time_{a.profile}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, f"audit_time_{a.profile}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
