"""``fa4verify audit``: run every check, print the verdict, write reports, gate a release.

Exit codes: 0 every check that ran is within budget; 1 a violation (budget, determinism,
bit-exactness) or, with --baseline, a regression; 2 usage/environment error (nothing written);
3 a check could not complete (exception, worker crash, import error); 5 nothing ran (all
skipped or none selected); 10 undecided.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Iterator, Optional

import click

from fa4verify._options import build_config, click_options
from fa4verify.errors import OptionError
from fa4verify.audit.report_files import write_reports


from fa4verify.cli._common import (  # noqa: E402,F401 - shared by every subcommand
    FiniteFloat, OneLineCommand, OneLineGroup, OneLineUsageError, _prog,
)


def _usage(msg: str) -> OneLineUsageError:
    return OneLineUsageError(msg)


def _list(specs, selected, config, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fa4verify.audit.registry import cuda_available, unmet_need
    from fa4verify.audit.runner import module_label

    have_cuda = cuda_available() if any("cuda" in s.spec.needs for s in selected) else False
    tab = Table(title=f"{len(selected)} check(s) selected of {len(specs)} discovered "
                      f"(profile {config.profile}, archs {','.join(config.archs)})",
                title_justify="left")
    tab.add_column("id", no_wrap=True)
    for col in ("title", "needs", "profiles", "module", "would run"):
        tab.add_column(col, overflow="fold")
    for s in selected:
        reason = unmet_need(s.spec, config.device, cuda=have_cuda)
        if reason is None and s.arch not in config.archs:
            reason = f"arch {s.arch} not selected"
        tab.add_row(escape(s.id), escape(s.spec.title), ",".join(sorted(s.spec.needs)),
                    ",".join(p for p in ("quick", "default", "full", "exhaustive")
                             if p in s.spec.profiles),
                    module_label(s.spec.module), "yes" if reason is None else escape(f"skip: {reason}"))
    console.print(tab)


@click.command(name="audit", cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click_options
@click.option("-k", "keyword", default=None, metavar="EXPR",
              help="Select checks whose id/title match EXPR (substrings, * wildcards, and/or/not).")
@click.option("--list", "list_only", is_flag=True, help="List the selected checks and exit.")
@click.option("--json", "json_path", default=None, metavar="FILE", help="Write the JSON report.")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Write JUnit XML.")
@click.option("--html", "html_path", default=None, metavar="FILE",
              help="Write the self-contained HTML report (plots embedded).")
@click.option("--baseline", "baseline_path", default=None, metavar="FILE",
              help="Previous JSON report: also fail (exit 1) on any metric regression.")
@click.option("--regression-rtol", default=0.0, type=FiniteFloat(min=0.0), show_default=True,
              metavar="R",
              help="Relative growth of a metric tolerated before it counts as a regression.")
@click.option("--live/--no-live", "live", default=None,
              help="Live progress display (default: on a TTY only).")
@click.option("--gpus", "gpus", default=None, metavar="all|N|I,J",
              help="Spread the checks over a node's GPUs: the engine's workers are pinned one per "
                   "GPU (CUDA_VISIBLE_DEVICES before CUDA starts), --workers per GPU, longest tasks "
                   "first; the report and verdicts of a one-GPU audit. 'all', a count N, or indices "
                   "'I,J' ('I,' for one). Excludes --shard. CPU test mode: FA4VERIFY_FAKE_GPUS=N.")
@click.option("--source-coverage", "source_dir", default=None, metavar="DIR",
              help="Record which lines of FA4's source the audit ran (host code, and the kernel code "
                   "traced into each kernel it compiled) and write DIR/source_coverage.{txt,json}: per "
                   "FA4 file and function, what no check ran and what only a drawn campaign ran. DIR "
                   "must be new or empty; the audit compiles every kernel afresh in DIR/kernel-cache.")
def command(dtype, device, arch, profile, seed, shard, checks_modules, no_default_checks, isolate,
            timeout, workers, fresh_workers, kernel_cache, opts, fake_device, deployment, keyword, list_only, json_path, junit_path, html_path, baseline_path,
            regression_rtol, live, gpus, source_dir):
    """Run every audit check, print the verdict, write reports and return the gate's exit code.

    \b
    On a CPU machine: the CPU twins and the compile-only census; on a GPU machine also the
    production FA4 kernels, in persistent worker subprocesses run side by side (--workers; a
    CUDA fault is reported as that check's error, its worker replaced, and the audit goes on).
    FA4's compiled kernels persist in --kernel-cache, so a second audit skips most compiles.
    \b
    Exit: 0 within budget, 1 violation/regression, 2 usage or environment error,
          3 a check crashed, 5 nothing ran, 10 undecided.
    """
    from fa4verify.audit.runner import compile_keyword
    from fa4verify.errors import KeywordError

    t_start = time.time()
    with _source_coverage(None if list_only else source_dir, kernel_cache) as kernel_cache:
        raw = dict(dtype=dtype.lower(), device=device.lower(), arch=arch,
                   profile=profile.lower(), seed=seed, keyword=keyword, shard=shard,
                   checks_modules=checks_modules, no_default_checks=no_default_checks,
                   isolate=isolate.lower(), timeout=timeout, opts=opts,
                   deployment=deployment, workers=workers,
                   fresh_workers=fresh_workers, kernel_cache=kernel_cache, fake_device=fake_device)
        # Note [Workers before the CUDA probe]: a GPU audit's workers start before this process
        # imports torch to probe CUDA (seconds on the H200, measured: the zygote's imports then overlap
        # the probe as well as the discovery)
        early_pool = None
        if gpus is None and not list_only:
            early_pool = _start_pool_early(raw)
        try:                    # every way out closes the early pool (usage errors, Ctrl-C, the end)
            try:
                config = build_config(**raw)
                compile_keyword(keyword)
            except (OptionError, KeywordError) as e:
                raise _usage(str(e)) from None
            from fa4verify.checks.long_context import row_stride
            try:
                row_stride()                       # an environment setting of a check: bad input, exit 2
            except ValueError as e:
                raise _usage(str(e)) from None
            if early_pool is not None and not _pool_fits(early_pool, config):
                early_pool.close()
                early_pool = None
            return _checked_run(config, early_pool, t_start, gpus=gpus, shard=shard, list_only=list_only,
                                baseline_path=baseline_path, regression_rtol=regression_rtol,
                                json_path=json_path, junit_path=junit_path, html_path=html_path, live=live,
                                workers_auto=str(workers if workers is not None else "auto").strip().lower()
                                == "auto")
        finally:
            if early_pool is not None:
                early_pool.close()


@contextlib.contextmanager
def _source_coverage(source_dir: Optional[str], kernel_cache: Optional[str]) -> Iterator[Optional[str]]:
    """The audit inside ``--source-coverage DIR`` (Note [Source coverage]), yielding the kernel
    cache it then uses; without DIR, the kernel cache asked for, and no tracing (a trace variable
    inherited from the shell is set aside: only the option turns tracing on). Whatever was in the
    environment before is back after the audit."""
    from fa4verify.coverage.source import TRACE_ENV
    inherited = os.environ.pop(TRACE_ENV, None)
    try:
        if source_dir is not None:
            kernel_cache = _source_coverage_setup(source_dir, kernel_cache)
        yield kernel_cache
    finally:
        os.environ.pop(TRACE_ENV, None)
        if inherited is not None:
            os.environ[TRACE_ENV] = inherited


def _source_coverage_setup(source_dir: str, kernel_cache: Optional[str]) -> str:
    """``--source-coverage DIR`` (Note [Source coverage], :mod:`fa4verify.coverage.source`): DIR
    checked (new, empty, or holding only the empty ``traces/`` and ``kernel-cache/`` a refused run
    left), the workers' trace directory set in the environment they inherit (created by the first
    trace), and the kernel cache the audit then uses (DIR/kernel-cache, empty: a kernel loaded
    from a cache is not traced; ``--kernel-cache off`` is kept). Anything else is a usage error."""
    from fa4verify.coverage.source import TRACE_ENV, fa4_root
    given = None if kernel_cache is None else str(kernel_cache).strip().lower()
    if given not in (None, "auto", "off"):
        raise _usage("--source-coverage compiles every kernel afresh in DIR/kernel-cache: leave out "
                     "--kernel-cache (or give --kernel-cache off)")
    preset = [k for k in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")
              if os.environ.get(k)]
    if preset:
        raise _usage(f"--source-coverage: unset {' and '.join(preset)} (FA4 would load its kernels from "
                     "that cache, untraced)")
    if fa4_root() is None:
        raise _usage("--source-coverage: flash-attn-4 is not installed here (nothing of FA4 to trace)")
    d = os.path.abspath(source_dir)
    if os.path.lexists(d) and not os.path.isdir(d):
        raise _usage(f"--source-coverage {source_dir!r}: exists and is not a directory")
    try:
        left = os.listdir(d) if os.path.isdir(d) else []
        stale = [n for n in left if n not in ("traces", "kernel-cache")
                 or not os.path.isdir(os.path.join(d, n)) or os.listdir(os.path.join(d, n))]
    except OSError as e:
        raise _usage(f"--source-coverage {source_dir!r}: cannot read it ({e.strerror})") from None
    if stale:
        raise _usage(f"--source-coverage {source_dir!r}: not empty (give a new or empty directory: "
                     "traces of two runs must not mix)")
    os.environ[TRACE_ENV] = os.path.join(d, "traces")
    return "off" if given == "off" else os.path.join(d, "kernel-cache")


def _write_source_coverage(console) -> None:
    """Note [Source coverage]: the report of a ``--source-coverage`` run, beside its traces; a
    report that cannot be built or written is one line on stderr (the gate's exit code stands)."""
    from fa4verify.coverage import source
    trace_dir = os.environ.get(source.TRACE_ENV)
    root = source.fa4_root()
    if not trace_dir or root is None:
        return
    out = os.path.dirname(os.path.abspath(trace_dir))
    try:
        rep = source.report(source.load_traces(trace_dir), root)
        with open(os.path.join(out, "source_coverage.json"), "w") as f:
            json.dump(rep, f, indent=1)
        with open(os.path.join(out, "source_coverage.txt"), "w") as f:
            f.write(source.render(rep) + "\n")
    except (OSError, ValueError) as e:
        click.echo(f"fa4verify audit: error: cannot write the source coverage report in {out}: {e}", err=True)
        return
    run = sum(d["run"] for d in rep["files"].values())
    planned = sum(d["by_construction"] for d in rep["files"].values())
    total = sum(d["executable"] for d in rep["files"].values())
    console.print(f"FA4 source coverage: {run} of {total} executable lines of flash_attn/cute run by "
                  f"{rep['tasks']} task(s), {planned} by planned checks: {os.path.join(out, 'source_coverage.txt')}")


def _start_pool_early(raw: dict):
    """Note [Workers before the CUDA probe]: the worker pool of an audit that will run on a GPU,
    started from the raw options before :func:`build_config` probes CUDA (which imports torch in
    this process). Only when the GPU is certain enough to be worth it -- ``--device cuda`` or
    ``auto``, and a GPU that nvidia-smi lists -- and the options already make a pool
    (``build_config`` with ``cuda=True`` and the arch left out, so nothing here imports torch);
    any doubt returns None and the pool starts after the probe, as before. The caller closes
    it when the real configuration does not match (:func:`_pool_fits`)."""
    if (raw["device"] not in ("cuda", "auto") or raw["fresh_workers"] or raw["isolate"] == "never"
            or raw.get("fake_device")):     # Note [Fake device audit]: its pool starts after entering it
        return None
    from fa4verify.run.pool import WorkerPool, _visible_compute_cap
    if _visible_compute_cap(dict(os.environ)) is None:
        return None
    try:
        pre = build_config(**dict(raw, arch=("sm90",), deployment=None), cuda=True)
    except OptionError:
        return None                 # the real build says what is wrong
    return WorkerPool.for_audit(pre)


def _pool_fits(pool, config) -> bool:
    """Whether an early pool is the one :meth:`WorkerPool.for_audit` would make for ``config``."""
    return (config.device == "cuda" and not config.fresh_workers and config.isolate != "never"
            and pool.size == config.workers and pool.timeout == config.timeout
            and pool.kernel_cache == config.kernel_cache)


def _checked_run(config, early_pool, t_start, *, gpus, shard, list_only, baseline_path,
                 regression_rtol, json_path, junit_path, html_path, live, workers_auto=False) -> int:
    """The audit after its options are parsed: the inputs and outputs checked, then the run."""
    from fa4verify.audit.atomic import check_outputs
    from fa4verify.errors import OutputPathError
    from fa4verify.audit.report_json import load_report
    from fa4verify.errors import ReportError
    from fa4verify.error_budgets.loader import BUDGET_FILE_ENV, budget_file_from_env
    gpu_sel = _select_gpus(gpus, shard, config.device) if gpus is not None else None
    if gpu_sel:
        # --workers per GPU (auto: the node's cores shared by the GPUs' workers)
        import dataclasses

        from fa4verify._options import auto_workers
        per = auto_workers("cuda", max(1, (os.cpu_count() or 1) // len(gpu_sel))) if workers_auto \
            else config.workers
        config = dataclasses.replace(config, workers=len(gpu_sel) * per)
    inputs = [("--baseline", baseline_path)]
    inputs += [("--checks-module", m) for m in config.checks_modules if m.endswith(".py")]
    from fa4verify.error_budgets.input_files import InputPathError, check_readable

    for opt, m in inputs[1:]:
        if os.path.lexists(m):   # a FIFO or device given as a check module would hang the import
            try:
                check_readable(m)
            except InputPathError as e:
                raise _usage(f"{opt} {e}") from None
    budget_file = budget_file_from_env()
    if budget_file is not None:
        inputs.append((BUDGET_FILE_ENV, budget_file))
    try:
        check_outputs([("--json", json_path), ("--junit", junit_path), ("--html", html_path)],
                      inputs=inputs)
    except OutputPathError as e:
        raise _usage(str(e)) from None
    baseline = None
    if baseline_path is not None:
        try:
            baseline = load_report(baseline_path)
        except ReportError as e:
            raise _usage(f"--baseline {e}") from None
    if budget_file is not None:
        from fa4verify.error_budgets.loader import BudgetError, load_file

        try:
            load_file(budget_file)
        except BudgetError as e:
            raise _usage(f"{BUDGET_FILE_ENV}: {e}") from None

    from fa4verify.audit.atomic import output_lock

    if list_only:
        json_path = junit_path = html_path = None
    with output_lock([("--json", json_path), ("--junit", junit_path), ("--html", html_path)]):
        # Note [One writer per report set]
        return _run_with_pool(config, gpu_sel, early_pool, t_start, list_only=list_only,
                              baseline=baseline, baseline_path=baseline_path,
                              regression_rtol=regression_rtol, budget_file=budget_file,
                              json_path=json_path, junit_path=junit_path, html_path=html_path,
                              live=live)


def _run_with_pool(config, gpu_sel, early_pool, t_start, *, list_only, baseline, baseline_path,
                   regression_rtol, budget_file, json_path, junit_path, html_path, live) -> int:
    # a GPU audit's workers start now at the latest, before the checks are discovered: their
    # start-up (the imports of torch and FA4, a CUDA context each; seconds, measured on the H200)
    # overlaps everything this process does before its first check
    own_pool = None
    if (early_pool is None and config.device == "cuda" and gpu_sel is None and not list_only
            and not config.fresh_workers and config.isolate != "never"):
        from fa4verify.run.pool import WorkerPool
        early_pool = own_pool = WorkerPool.for_audit(config)
    try:
        return _audit_run(config, gpu_sel, early_pool, t_start, list_only=list_only, baseline=baseline,
                          baseline_path=baseline_path, regression_rtol=regression_rtol,
                          budget_file=budget_file, json_path=json_path, junit_path=junit_path,
                          html_path=html_path, live=live)
    finally:
        if own_pool is not None:
            own_pool.close()


def _audit_run(config, gpu_sel, early_pool, t_start, *, list_only, baseline, baseline_path,
               regression_rtol, budget_file, json_path, junit_path, html_path, live) -> int:
    """The audit after its options are checked (and, on a GPU, its workers started)."""
    from fa4verify.audit.runner import load_specs, select
    from fa4verify.audit.terminal import TerminalReporter, make_console, render_verdict

    console = make_console()
    specs = load_specs(config)
    selected = select(specs, config)
    if list_only:
        _list(specs, selected, config, console)
        return 0

    from fa4verify.audit import environment
    from fa4verify.audit.baseline import compare, config_mismatch, gate
    from fa4verify.audit.report_json import build_report
    from fa4verify.audit.runner import exit_code_for, run_audit

    reporter = TerminalReporter(console, live=live)
    envs = None
    if gpu_sel is not None:
        click.echo(f"fa4verify audit: {len(selected)} check(s), {config.workers} worker(s) over "
                   f"{len(gpu_sel)} GPU(s): " + ", ".join(g.label() for g in gpu_sel), err=True)
    from fa4verify.run.worker import profiled
    run = profiled("parent", run_audit, config, specs=specs, selected=selected, reporter=reporter,
                   pool=early_pool, gpus=[g.visible for g in gpu_sel] if gpu_sel else None)
    results = [r.to_dict() for r in run.records]
    bl = None
    if baseline is not None:
        bl = compare(results, baseline, rtol=regression_rtol, path=baseline_path)
        bl["mismatch"] = config_mismatch(config.to_dict(), baseline)
    code = gate(exit_code_for(run.records, regressions=len(bl["regressions"]) if bl else 0), bl)
    t_env = time.time()
    env_now = environment.collect(config.device)
    phases = dict(getattr(run, "phases", {}) or {}, before_run=round(run.started - t_start, 3),
                  run=round(run.finished - run.started, 3), environment=round(time.time() - t_env, 3))
    if early_pool is not None:       # Note [Workers before the CUDA probe]: when they started
        phases.update(early_pool.start_times(t_start))
    cfg_dict = config.to_dict()
    if budget_file is not None:
        cfg_dict["budget_file"] = budget_file
    report = build_report(config=cfg_dict, environment=env_now,
                          results=results, exit_code=code, duration_s=time.time() - t_start,
                          command=_command_line(), baseline=bl, environments=envs)
    report["summary"]["discovered"] = run.discovered
    report["summary"]["phases"] = phases
    if gpu_sel is not None:
        report["gpus"] = [g.to_json() for g in gpu_sel]
    try:
        write_reports(report, json_path=json_path, junit_path=junit_path, html_path=html_path)
    except OSError as e:
        click.echo(f"fa4verify audit: error: cannot write report: {e}", err=True)
        render_verdict(report, console)
        return 2
    render_verdict(report, console)
    for label, p in (("JSON", json_path), ("JUnit", junit_path), ("HTML", html_path)):
        if p:
            console.print(f"{label} report: {p}")
    _write_source_coverage(console)
    from fa4verify.run import bytecode
    bytecode.fill_some(bytecode.missing(), n=10**9, seconds=1.0)   # Note [Bytecode cache]
    return code


def _select_gpus(gpus: str, shard, device: str):
    """``--gpus``: the GPUs to spread the checks over, or a one-line usage error."""
    from fa4verify.run import gpus as run_gpus

    if shard is not None:
        raise _usage("--gpus and --shard exclude each other (--gpus shards over this node's GPUs; "
                     "--shard I/N takes one part of a run split over machines)")
    try:
        fake = run_gpus.fake_mode()
        if not fake and device != "cuda":
            raise ValueError(f"--gpus runs the checks on GPUs, but --device is {device} "
                             f"(CPU test mode: {run_gpus.ENV_FAKE}=N)")
        return run_gpus.select_gpus(gpus, run_gpus.visible_gpus())
    except ValueError as e:
        msg = str(e)
        raise _usage(msg if msg.startswith("--") else f"--gpus: {msg}") from None


def _command_line() -> list[str]:
    """argv of this run when started as the ``fa4verify`` program, else the command path."""
    prog = os.path.basename(sys.argv[0]) if sys.argv else ""
    if prog in ("fa4verify", "__main__.py"):
        return ["fa4verify"] + sys.argv[1:]
    ctx = click.get_current_context(silent=True)
    return [ctx.command_path if ctx is not None else "fa4verify audit", "(called in-process)"]
