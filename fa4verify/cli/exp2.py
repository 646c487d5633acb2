"""``fa4verify exp2``: certify FA4's polynomial exp2 emulation over every fp32 input of a range.

Every figure is labelled "CPU twin" (the bit-exact numpy model of ``ex2_emulation_2``) except the
certified polynomial bound (exact mathematics) and the MUFU statistics (read from a file recorded
on a GPU, when present).
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import click

from fa4verify.cli import ExitCode
from fa4verify.cli._common import OneLineCommand, check_outputs, usage, write_outputs
from fa4verify.exp2.mufu_stats import mufu_section, mufu_where as _mufu_where

#: Largest --sample (each input costs ~100 bytes of temporaries; --exhaustive covers every input).
MAX_SAMPLE = 1 << 24
#: Largest --jobs (worker processes).
MAX_JOBS = 64
#: The fp32 exponent arguments of the emulation: below -127 FA4 clamps (result 0), >= 128 the
#: exponent field overflows; a range must be made of float32 values.
F32_MAX = 3.4028234663852886e38


def _versions() -> dict:
    import numpy as np
    from fa4verify import __version__
    from fa4verify.kernels.fa4_params import load_params
    p = load_params()

    from fa4verify.kernels.facts import dist_version as v
    return {"fa4": p.fa4_version, "dsl": p.dsl_version or v("nvidia-cutlass-dsl"), "numpy": np.__version__,
            "fa4verify": __version__, "python": platform.python_version(), "params_source": p.source}


def _degrees(spec: str) -> list[int]:
    from fa4verify.kernels.fa4_params import load_params
    avail = sorted(d for d in load_params().poly_ex2 if d >= 1)
    if spec == "all":
        return avail
    try:
        d = int(spec)
    except ValueError:
        raise usage(f"--degree: unknown degree {spec!r}: expected one of {avail} or 'all'") from None
    if d not in avail:
        raise usage(f"--degree: unknown degree {d}: FA4 has polynomials of degree {avail}")
    return [d]


def sample_stats(degree: int, lo: float, hi: float, n: int, seed: int):
    """Direct statistics on ``n`` inputs drawn uniformly over the float32 values of [lo, hi]
    (uniform over fp32 bit patterns in the main domain), sorted."""
    import numpy as np
    from fa4verify.oracles import binary32 as b32
    from fa4verify.exp2 import cert as ec
    lo2, hi2 = max(lo, -126.0), min(hi, 127.99999)
    olo, ohi = b32.f32_range(lo2, hi2) if lo2 <= hi2 else (1, 0)
    if ohi < olo:
        return ec.Stats()
    rng = np.random.default_rng(seed)
    o = np.unique(rng.integers(olo, ohi + 1, size=n, dtype=np.int64))
    x = ec._ordered_to_f32(o)
    emu = ec.emu_direct(x, ec._coeffs(degree))
    st = ec.direct_stats(x, emu)
    st.mono_violations = -1        # not meaningful on a sample (non-adjacent inputs)
    return st


def run_exp2(degrees: list[int], lo: float, hi: float, *, sample: int | None, direct: bool, jobs: int,
             seed: int, progress: bool = True) -> dict:
    """Compute the report (a JSON-able dict) for each degree."""
    from fa4verify.exp2 import cert as ec
    from fa4verify.kernels.fa4_params import load_params
    from fa4verify.oracles.poly_bound import certified_sup_rel_error
    params = load_params()
    report = {"tool": "fa4verify exp2", "where": "CPU twin", "versions": _versions(),
              "params_source": params.source,
              "range": [lo, hi], "mode": ("sample" if sample else ("exhaustive-direct" if direct else "exhaustive")),
              "sample_size": sample, "seed": seed if sample else None, "jobs": jobs,
              "rate_conventions": {
                  "per_input": "each fp32 input of the range counted once",
                  "uniform_in_value": "each input weighted by its spacing ulp(x): the fraction of the "
                                      "range's length where the result is wrong (FA4 paper / FA #2263)"},
              "main_domain": "x >= -126 (exact 2^x a normal fp32) and x < 128",
              "degrees": {}, "mufu": mufu_section()}
    if not params.installed:
        report["warning"] = "flash-attn-4 is not installed: coefficients and knobs from the pinned copy"
    ready = os.environ.get("FA4VERIFY_READY_FILE")
    if ready:          # a signal test's readiness marker (issue 30 item 8): the sweep starts now
        Path(ready).touch()
    for d in degrees:
        t0 = time.perf_counter()
        if sample:
            st = sample_stats(d, lo, hi, sample, seed)
            res_pieces, fallbacks, secs = {"direct": st.n}, None, time.perf_counter() - t0
        else:
            bar = _Progress(f"degree {d}", enabled=progress)
            with bar:
                def step(done: int, total: int) -> None:
                    _INTERRUPT.check()           # Note [exp2 interrupt]: between tasks
                    bar.update(done, total)
                res = ec.sweep(d, lo, hi, method="direct" if direct else "fast", jobs=jobs, progress=step)
            st, res_pieces, fallbacks, secs = res.stats, res.pieces, res.fallbacks, res.seconds
        pb = certified_sup_rel_error(params.poly_ex2[d], rel_tol=1e-6)
        entry = {
            "where": "CPU twin", "n_inputs": st.n, "seconds": round(secs, 2),
            "method_pieces": res_pieces, "oracle_fallbacks": fallbacks,
            "max_rel_error": st.max_rel, "argmax_rel_error": st.argmax_rel,
            "signed_rel_error_at_max": st.signed_rel_at_max,
            "max_ulp_fp32": st.max_ulp32, "argmax_ulp_fp32": st.argmax_ulp32,
            "max_ulp_bf16_after_rounding": st.max_ulp_bf16, "argmax_ulp_bf16": st.argmax_ulp_bf16,
            "max_ulp_fp16_after_rounding": st.max_ulp_f16, "argmax_ulp_fp16": st.argmax_ulp_f16,
            "wrong_count_bf16": st.wrong_bf16, "wrong_count_fp16": st.wrong_f16,
            "wrong_rate_bf16_per_input": st.wrong_bf16 / st.n if st.n else None,
            "wrong_rate_fp16_per_input": st.wrong_f16 / st.n if st.n else None,
            "wrong_rate_bf16_uniform_in_value": st.weight_wrong_bf16 / st.weight if st.weight else None,
            "wrong_rate_fp16_uniform_in_value": st.weight_wrong_f16 / st.weight if st.weight else None,
            "worst_wrong_bf16": {"x": st.worst_wrong_bf16, "bf16_ulp": st.worst_wrong_bf16_ulp},
            "worst_wrong_fp16": {"x": st.worst_wrong_f16, "fp16_ulp": st.worst_wrong_f16_ulp},
            "monotonicity_violations": st.mono_violations if not sample else "not measured on a sample",
            "certified_poly_bound": {**pb.as_dict(), "where": "exact (mpmath.iv)",
                                     "meaning": "max over f in [0,1] of |p(f)/2^f - 1| with exact coefficients "
                                                "and exact arithmetic; fp32 rounding is measured by the sweep"},
            "mean_rel_error_uniform_0_1": ec.grid_mean_rel(d),
            "edge_domain": ec.edge_report(d, lo, hi),
        }
        report["degrees"][str(d)] = _clean(entry)
    return report


def judge(report: dict) -> dict:
    """Judge every degree's measured maxima (main domain) against its certified bound and the
    emulation budget, and the GPU-recorded MUFU figures against theirs; returns the verdict.

    * certified bound: ``B = (1 + E)(1 + gamma_d) 2^(2^-25) - 1`` with ``E`` the certified sup
      of the exact polynomial's error (Note [exp2 a-priori bound], fa4verify/checks/exp2.py), on
      ``max_rel_error``, and ``1/2 + B 2^(p+1)`` on the bf16 / fp16 ulps after rounding;
    * budget: ``emu_rel`` of the error budgets (``stage.exp2_emu``: the relative error every
      composed budget assumes for the emulation), on ``max_rel_error``;
    * monotonicity (exhaustive sweeps);
    * MUFU ex2.approx / GPU emulation statistics: ``mufu_ex2_rel`` / ``emu_rel``, the flush band
      apart (``fa4verify.checks.exp2.judge_mufu``).
    """
    from fa4verify.checks.exp2 import apriori_bound, budget_constants, judge_mufu
    consts = budget_constants("bf16", "sm100")
    emu_rel = float(consts["emu_rel"])
    out = {"budget": {"emu_rel": emu_rel, "source": "error_budgets bf16_sm100 (stage.exp2_emu)"},
           "degrees": {}, "mufu": [], "violations": []}
    for d, e in report["degrees"].items():
        checks = []
        if e["n_inputs"]:
            B = apriori_bound(float(e["certified_poly_bound"]["upper"]), int(d))
            rel = e["max_rel_error"]
            checks.append(("certified bound", "max_rel_error", rel, B))
            checks.append(("certified bound", "bf16 ulp after rounding", e["max_ulp_bf16_after_rounding"],
                           0.5 + B * 2.0**8))
            checks.append(("certified bound", "fp16 ulp after rounding", e["max_ulp_fp16_after_rounding"],
                           0.5 + B * 2.0**11))
            checks.append(("budget emu_rel", "max_rel_error", rel, emu_rel))
            if isinstance(e.get("monotonicity_violations"), int):
                checks.append(("monotonicity", "monotonicity_violations", e["monotonicity_violations"], 0))
        rows = []
        for kind, what, measured, limit in checks:
            ok = measured is not None and measured <= limit
            rows.append({"against": kind, "figure": what, "measured": measured, "limit": limit,
                         "ok": ok})
            if not ok:
                out["violations"].append(f"degree {d}: {what} {measured:.6g} > {kind} {limit:.6g}")
        out["degrees"][d] = {"status": ("pass" if all(r["ok"] for r in rows) else "fail") if rows else "nothing measured",
                             "checks": rows}
    dev = report.get("device")
    if dev:
        out["violations"] += list(dev.get("violations", []))
    m = report.get("mufu") or {}
    st = (m.get("stats") or {}).get("stats", {}) if isinstance(m.get("stats"), dict) else {}
    if st:
        out["mufu"] = judge_mufu(st, consts)
        out["violations"] += [r["text"] for r in out["mufu"] if r["status"] == "fail"]
    return out


def _clean(o):
    if isinstance(o, float):
        if math.isinf(o):
            return "inf" if o > 0 else "-inf"
        return None if math.isnan(o) else o
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item"):
        return _clean(o.item())
    return o


class _Interrupt:
    """Note [exp2 interrupt]: while the sweep runs, SIGINT only sets a flag, and the sweep raises
    KeyboardInterrupt between its tasks and before any output is written. With Python's own
    handler a SIGINT that came as the sweep started was lost in about one run in eight on the
    2-core CI box (exit 0 and a complete report after Ctrl-C; or death by the signal): the
    KeyboardInterrupt raised inside the sweep's numeric code did not always reach the command.
    A process that ignores SIGINT (a background job) keeps ignoring it."""

    def __init__(self) -> None:
        self.hit, self._prev = False, None

    def __enter__(self) -> "_Interrupt":
        import signal
        import threading
        self.hit = False
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._prev = signal.signal(signal.SIGINT, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.hit = True

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> bool:
        import signal
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
            self._prev = None
        return False


_INTERRUPT = _Interrupt()


class _Progress:
    """A rich progress bar on a terminal; silent otherwise (CI logs stay readable)."""

    def __init__(self, label: str, enabled: bool = True):
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._p = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TextColumn
            from rich.console import Console
            self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._p.__enter__()
            self._task = self._p.add_task(f"CPU twin exp2 sweep, {self.label}", total=None)
        return self

    def update(self, done: int, total: int) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=done, total=total)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
        return False


def render(report: dict) -> str:
    v = report["versions"]
    lines = ["fa4verify exp2 -- CPU twin of flash_attn.cute.utils.ex2_emulation_2 (bit-exact numpy model)",
             f"  fa4 {v['fa4']}, cutlass-dsl {v['dsl']}, numpy {v['numpy']}, fa4verify {v['fa4verify']}",
             f"  params: {report['params_source']}",
             f"  range [{report['range'][0]}, {report['range'][1]}], mode {report['mode']}"
             + (f" (n={report['sample_size']}, seed={report['seed']})" if report["sample_size"] else "")]
    if "warning" in report:
        lines.append(f"  WARNING: {report['warning']}")
    for d, e in report["degrees"].items():
        pb = e["certified_poly_bound"]
        if not e["n_inputs"]:
            lines += [f"\ndegree {d}: no input of the range lies in the main domain [-126, 128) "
                      f"(certified poly bound [{pb['lower']:.6g}, {pb['upper']:.6g}]; edge domain in --json)"]
            continue
        lines += [
            f"\ndegree {d}  [CPU twin, {e['n_inputs']:,} inputs, {e['seconds']} s]",
            f"  max_rel_error (x >= -126)        {e['max_rel_error']:.6g}  at x = {e['argmax_rel_error']!r}",
            f"  max_ulp_fp32                     {e['max_ulp_fp32']}  at x = {e['argmax_ulp_fp32']!r}",
            f"  max_ulp_bf16_after_rounding      {e['max_ulp_bf16_after_rounding']:.4f}  at x = {e['argmax_ulp_bf16']!r}",
            f"  max_ulp_fp16_after_rounding      {e['max_ulp_fp16_after_rounding']:.4f}  at x = {e['argmax_ulp_fp16']!r}",
            f"  wrong_count_bf16                 {e['wrong_count_bf16']:,}  rate per input {e['wrong_rate_bf16_per_input']:.4%}, "
            f"uniform in value {e['wrong_rate_bf16_uniform_in_value']:.4%}",
            f"  wrong_count_fp16                 {e['wrong_count_fp16']:,}  rate per input {e['wrong_rate_fp16_per_input']:.4%}, "
            f"uniform in value {e['wrong_rate_fp16_uniform_in_value']:.4%}",
            f"  monotonicity violations          {e['monotonicity_violations']}",
            f"  certified poly bound (exact)     [{pb['lower']:.6g}, {pb['upper']:.6g}]",
            f"  mean |rel| on [0,1) (uniform)    {e['mean_rel_error_uniform_0_1']['mean_abs_rel_error']:.4g} "
            f"(signed {e['mean_rel_error_uniform_0_1']['mean_signed_rel_error']:.3g}; 2^-24 grid)",
        ]
        ed = e["edge_domain"]
        sr = ed["subnormal_region"]
        tn = ed["tiny_negatives"]
        lines += [f"  edge: NaN -> {ed['nan']['emu']}, -inf -> {ed['-inf']['emu']}, +inf -> {ed['+inf']['emu']}, "
                  f"x <= -127 -> 0: {ed['le_minus127']['all_zero']}",
                  f"  edge: (-127,-126) {sr['n_inputs']:,} inputs, wrong fp32 {sr['wrong_count_fp32']:,}, "
                  f"bf16 {sr['wrong_count_bf16']:,}, max {sr['max_ulp_fp32']} fp32 ulps",
                  f"  edge: [-2^-25, 0) {tn['n_inputs']:,} inputs give {tn['emu_value']!r} "
                  f"({tn['fp32_ulp_error']} fp32 ulps from 1.0; bf16/fp16 round correctly: "
                  f"{tn['bf16_rounds_correctly']}/{tn['fp16_rounds_correctly']})"]
    if report.get("device"):
        lines += render_device(report["device"])
    m = report["mufu"]
    lines.append(f"\nMUFU ex2.approx: {m['status']}" + (f" ({m.get('note', '')})" if m["status"] == "not measured here" else
                                                         f" (read from {m.get('source')})"))
    v = report.get("verdict") or {}
    for r in v.get("mufu", []):
        lines.append(f"  {r['status'].upper():<9} {r['text']}  [{_mufu_where(m)}]")
    if v:
        lines.append(f"\nverdict (budget emu_rel = {v['budget']['emu_rel']:.4g}, {v['budget']['source']}; "
                     "certified bound of Note [exp2 a-priori bound]):")
        for d, dv in v["degrees"].items():
            bad = [f"{c['figure']} {c['measured']:.6g} > {c['against']} {c['limit']:.6g}"
                   for c in dv["checks"] if not c["ok"]]
            lines.append(f"  degree {d}: " + ("VIOLATION: " + "; ".join(bad) if bad else dv["status"]))
    return "\n".join(lines)


def _device_gpu():
    """The local GPU for ``--device cuda``, or a one-line usage error (exit 2)."""
    from fa4verify.kernels.device import local_gpu
    gpu = local_gpu()
    if gpu is None:
        raise usage("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False)")
    if gpu.arch is None:
        raise usage(f"--device cuda: {gpu.unsupported_reason()}")
    try:
        from fa4verify.kernels.fa4_device import fa_utils  # noqa: F401 (the probes' FA4 import)
        import cutlass.cute  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is an environment error
        raise usage(f"--device cuda: FA4's device functions are not importable ({type(e).__name__}: {e})") from None
    return gpu


def device_section(degrees, lo, hi, *, gpu, mufu: bool = True, cpu_degrees: dict | None = None, **kw) -> dict:
    """``report["device"]``: the device sweep (``fa4verify.exp2.device.run_device``), its
    device-scored fp32 ulps cross-checked with the CPU certification of the same degrees."""
    from fa4verify.exp2 import device as ed
    t0 = time.perf_counter()
    sec = ed.run_device(degrees, lo, hi, gpu=gpu, mufu=mufu, **kw)
    sec["violations"] += ed.cross_check(sec, cpu_degrees or {})
    sec["versions"] = _versions()
    sec["seconds_total"] = round(time.perf_counter() - t0, 2)
    return _clean(sec)


def render_device(sec: dict) -> list[str]:
    lines = [f"\ndevice sweep [{sec['where']}] -- FA4's own device functions vs the device twin, bit for bit",
             f"  fa4 {sec['versions']['fa4']}, cutlass-dsl {sec['versions']['dsl']}; {sec['seconds_total']} s in all"]
    for s in sec["sweeps"]:
        sc = (s.get("scored") or {}).get("main") or {}
        lines.append(f"  {s['function']:<16} degree {s['degree']}: {s['n_inputs']:,} inputs (range + edge), "
                     f"mismatches {s['mismatches']:,}, {s['seconds']} s (+{s['compile_seconds']} s compile); "
                     f"max fp32 ulp vs CR {sc.get('max_ulp_fp32')} (CPU twin {s.get('cpu_max_ulp_fp32')})")
        for e in s["examples"][:3]:
            lines.append(f"      x = {e['x']!r} ({e['x_bits']}): device {e['device_bits']}, twin {e['twin_bits']}")
    m = sec.get("mufu")
    if m:
        parts = ", ".join(f"{k} max {v['max_ulp_fp32']} ulp at x = {v['argmax']!r}" for k, v in m["scored"].items())
        lines.append(f"  mufu ex2.approx.ftz: {m['n_inputs']:,} inputs, {parts} (vs CR fp32), {m['seconds']} s")
    lines.append("  " + ("every input bit-identical: the CPU twin certification above applies to the device functions"
                         if not sec["violations"] else "VIOLATION: " + "; ".join(sec["violations"])))
    return lines


@click.command("exp2", cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]},
               short_help="Certify FA4's polynomial exp2 emulation over all fp32 inputs.")
@click.option("--degree", default="3", show_default=True, metavar="3|5|all",
              help="Polynomial degree (POLY_EX2 key; FA4 runs 3) or 'all' (1-5).")
@click.option("--range", "range_", default="all", show_default=True, metavar="neg|pos|all|LO:HI",
              help="neg = [-127, 0], pos = [0, 8], all = [-127, 8] (8 = max_offset + rescale_threshold); "
                   "LO and HI float32 values.")
@click.option("--exhaustive", is_flag=True,
              help="Every fp32 input of the range (the default; fast reductions, see --direct).")
@click.option("--sample", type=click.IntRange(min=1, max=MAX_SAMPLE), default=None, metavar="N",
              help=f"N inputs drawn uniformly over the fp32 values of the range instead (N <= {MAX_SAMPLE:,}).")
@click.option("--direct", is_flag=True, help="Evaluate every input directly (slow; the reference for the fast path).")
@click.option("--jobs", type=click.IntRange(min=1, max=MAX_JOBS), default=2, show_default=True,
              help="Worker processes.")
@click.option("--json", "json_path", default=None, metavar="FILE",
              help="Write the full report as JSON (written at the end, atomically).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True,
              help="Seed for --sample.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: also sweep FA4's own device functions (ex2_emulation; ex2_emulation_2 on "
                   "SM100/103; MUFU ex2.approx) on the local GPU over every input of the range and the "
                   "edge domain, bit for bit against the twin (fa4verify/exp2/device.py).")
@click.option("--no-mufu", is_flag=True, help="With --device cuda: skip the MUFU ex2.approx sweep.")
def command(degree, range_, exhaustive, sample, direct, jobs, json_path, seed, device, no_mufu):
    """Certify FA4's polynomial exp2 (ex2_emulation_2) over a range of fp32 inputs (CPU twin).

    \b
    Exit: 0 every measured maximum within its certified bound and the emulation budget
          (emu_rel), 1 a violation, 2 bad input, 5 nothing measured.
    """
    from fa4verify.exp2.cert import parse_range
    try:
        lo, hi = parse_range(range_)
    except ValueError as e:
        raise usage(f"--range: {e}") from None
    if max(abs(lo), abs(hi)) > F32_MAX:
        raise usage(f"--range {range_!r}: LO and HI must be float32 values (|x| <= {F32_MAX:.8g})")
    if sample is not None and exhaustive:
        raise usage("--sample and --exhaustive are mutually exclusive")
    if sample is not None and direct:
        raise usage("--sample and --direct are mutually exclusive")
    degrees = _degrees(degree)
    gpu = _device_gpu() if device == "cuda" else None
    if gpu is not None and sample is not None:
        raise usage("--device cuda sweeps every input: --sample does not apply")
    check_outputs([("--json", json_path)])
    with _INTERRUPT:
        report = run_exp2(degrees, lo, hi, sample=sample, direct=direct, jobs=jobs, seed=seed)
        if gpu is not None:
            report["device"] = device_section(degrees, lo, hi, gpu=gpu, mufu=not no_mufu,
                                              cpu_degrees=report["degrees"])
        _INTERRUPT.check()
    report["verdict"] = _clean(judge(report))
    nothing = all(not e["n_inputs"] for e in report["degrees"].values())
    code = (ExitCode.NOTHING_RAN if nothing else
            ExitCode.VIOLATION if report["verdict"]["violations"] else ExitCode.OK)
    report["exit_code"] = int(code)
    click.echo(render(report))
    if json_path is not None:
        write_outputs([(json_path, (json.dumps(_clean(report), indent=2, allow_nan=False) + "\n").encode())])
        click.echo(f"wrote {json_path}", err=True)
    if nothing:
        click.echo("fa4verify exp2: nothing measured: the range has no input in [-126, 128)", err=True)
    # through click's Exit so that every way of calling the command (console script, CliRunner,
    # standalone click) sees the verdict's exit code
    raise click.exceptions.Exit(int(code))
