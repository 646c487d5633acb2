"""``fa4verify determinism``: bitwise reproducibility of FA4's deterministic backward.

Runs the backward with ``deterministic=True`` ``--runs`` times in each of ``--processes`` fresh
processes on each ``--devices`` device, with NaN-filled, guard-banded output buffers, compares
dQ/dK/dV/dsink through SHA-256 digests of their bytes, measures the default mode's divergence, and
optionally writes (``--manifest``) or checks against (``--against``) a digest manifest.
See :mod:`fa4verify.determinism` for the definitions.

With ``--gpus all|N|I,J`` the matrix runs in one spawned process per GPU (times ``--processes``),
each pinned to its GPU before CUDA starts, and the digests are compared across GPUs too
(:mod:`fa4verify.determinism.multi`; the engine and why: :mod:`fa4verify.run.gpus`). The manifest
then lists every GPU (name, UUID) and the per-GPU digests. With one GPU the verdict evidence says
"1 GPU: cross-GPU agreement not tested".

Exit codes: 0 reproducible (and manifest match / different environment), 1 a non-reproducible,
guard-band, unwritten-element or error result, a manifest mismatch or (``--gpus``) two GPUs
that disagree, 2 usage or environment error (no GPU: the reason is printed), 3 (``--gpus``) a GPU
process died or left a configuration without a result (an error, never a pass), 5 nothing ran
(every configuration unsupported).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import click

from fa4verify.cli import ExitCode
from fa4verify.cli._common import (FiniteFloat, OneLineCommand, check_inputs, check_output_dir,
                                   check_outputs, json_bytes, usage, write_outputs)


def _err(msg: str, code: ExitCode = ExitCode.USAGE) -> None:
    raise usage(msg)


def _fmt_div(dm: dict | None) -> str:
    if not dm:
        return "-"
    parts = []
    for t, v in dm["tensors"].items():
        if v["runs_differing"] or v["vs_deterministic_differing"]:
            parts.append(f"{t}: {v['runs_differing']}/{v['runs_compared']} runs differ, "
                         f"<= {v['max_differing_elements']} elems "
                         f"({100 * v['max_differing_fraction']:.2f}%), <= {v['max_ulp']} ulp; "
                         f"vs det {v['vs_deterministic_differing']} elems "
                         f"<= {v['vs_deterministic_max_ulp']} ulp")
        else:
            parts.append(f"{t}: identical")
    return "; ".join(parts)


def _print_report(report: dict, against: dict | None, timing: list[dict]) -> None:
    where = report.get("where") or "?"
    click.echo(f"# fa4verify determinism -- {where} (arch {report.get('arch')})")
    for c in report["configs"]:
        runs = f"{c.get('total_runs', 0)} runs ({len(c['processes'])} proc x " \
               f"{len(c['devices'])} dev)"
        click.echo(f"{c['status']:<17} {c['name']:<28} {c['attention']}/{c['mask']:<6} {runs}")
        if c.get("reason"):
            click.echo(f"    reason: {c['reason']}")
        if c.get("upstream_xfail"):
            click.echo(f"    upstream: {c['upstream_xfail']}")
        if c.get("digests"):
            click.echo("    sha256: " + " ".join(f"{t}={d[:12]}" for t, d in c["digests"].items()))
        if c.get("distinct_digests"):
            click.echo(f"    distinct digests: {c['distinct_digests']}")
        for k in ("guard_violations", "unwritten", "problems"):
            if c.get(k):
                click.echo(f"    {k}: {json.dumps(c[k])[:400]}")
        if c.get("default_mode"):
            click.echo(f"    default mode: {_fmt_div(c['default_mode'])}")
    click.echo("counts: " + ", ".join(f"{k}={v}" for k, v in report["counts"].items()))
    for t in timing:
        if t.get("status") == "ok":
            click.echo(f"timing {t['name']:<24} default {t['default_ms']:.3f} ms, deterministic "
                       f"{t['det_ms']:.3f} ms -> det/default {t['ratio_det_over_default']:.3f} "
                       f"(deterministic at {t['det_speed_pct_of_default']:.1f}% of default speed)"
                       f" [{where}]")
        else:
            click.echo(f"timing {t['name']:<24} {t.get('status')}: {t.get('reason')}")
    if against is not None:
        click.echo(f"manifest comparison: {against['verdict']}"
                   + ("" if against["same_environment"] else
                      f" (environment differs: {against['environment_diff']})"))
        for e in against["entries"]:
            if e["outcome"] != "match":
                click.echo(f"    {e['outcome']:<22} {e['key']}"
                           + (f" tensors={e['tensors']}" if e.get("tensors") else ""))


def _select_gpus(gpus: str, devices, timing: bool, backend: str, serial: bool):
    """``--gpus``: the GPUs, or a one-line usage error."""
    from fa4verify.run import gpus as run_gpus

    if devices is not None:
        raise usage("--gpus and --devices exclude each other (--devices: several devices in one "
                    "process; --gpus: one pinned process per GPU)")
    if timing:
        raise usage("--timing does not run with --gpus (time one GPU: --devices 0 --timing)")
    if serial:
        raise usage("--serial does not run with --gpus (the GPU processes run side by side)")
    try:
        fake = run_gpus.fake_mode()
        if fake and backend == "fa4":
            raise ValueError(f"{run_gpus.ENV_FAKE} is set: the fake GPUs run a CPU backend "
                             "(--backend twin)")
        if not fake and backend != "fa4":
            raise ValueError(f"--backend {backend}: --gpus runs the production backend fa4 "
                             f"({run_gpus.ENV_FAKE}=N: the CPU test mode with --backend twin)")
        return run_gpus.select_gpus(gpus, run_gpus.visible_gpus())
    except ValueError as ex:
        msg = str(ex)
        raise usage(msg if msg.startswith("--") else f"--gpus: {msg}") from None


@click.command("determinism", cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--runs", type=int, default=100, show_default=True, metavar="N",
              help="Deterministic backward runs per process and device.")
@click.option("--processes", type=int, default=3, show_default=True, metavar="P",
              help="Fresh Python processes (each compiles and runs on its own).")
@click.option("--configs", "configs", multiple=True, metavar="SPEC",
              help="Matrix name (h200, cpu), configuration names, globs (gqa-*) or @file.json; "
                   "repeatable, comma-separated. Default: h200 for --backend fa4, cpu otherwise.")
@click.option("--manifest", default=None, metavar="F",
              help="Write the digest manifest of this run to F.")
@click.option("--against", default=None, metavar="F",
              help="Compare this run's digests with the manifest F.")
@click.option("--strict-env", is_flag=True, help="With --against: a different environment key "
              "counts as a mismatch.")
@click.option("--json", "json_out", default=None, metavar="F", help="Write the full report (JSON) to F ('-' = stdout).")
@click.option("--default-mode/--no-default-mode", default=True, show_default=True,
              help="Also run the default (non-deterministic) mode and measure its divergence.")
@click.option("--default-runs", type=int, default=None, metavar="N",
              help="Default-mode runs per process and device. Default: --runs.")
@click.option("--devices", default=None, metavar="D",
              help="GPU indices ('0', '0,1') or 'all' (cross-device equality is checked). "
                   "Default: 0 for --backend fa4, cpu otherwise.")
@click.option("--gpus", default=None, metavar="all|N|I,J",
              help="One pinned process per GPU (x --processes); digests compared across GPUs, "
                   "processes and runs. 'all' = every visible GPU, N = the first N, 'I,J,...' = "
                   "those indices ('I,' for one). Excludes --devices and --timing. CPU test mode: "
                   "FA4VERIFY_FAKE_GPUS=N with --backend twin.")
@click.option("--gpu-timeout", type=FiniteFloat(min=0.0, min_open=True), default=None, metavar="S",
              help="With --gpus: kill a GPU process still running after S seconds (an error).")
@click.option("--timing", is_flag=True, help="Also time the backward, deterministic vs "
              "default (in one extra process after the matrix, on the first device).")
@click.option("--timing-reps", type=int, default=20, show_default=True, metavar="N")
@click.option("--backend", default="fa4", show_default=True, metavar="B",
              help="fa4 (production, GPU), twin[:smXX[+mutation]] (CPU twin), torch-math "
                   "(CPU reference for the harness), or module:attr.")
@click.option("--guard-bytes", type=int, default=None, metavar="B",
              help="Guard band width per side in bytes (default 4096).")
@click.option("--time-budget", type=FiniteFloat(min=0.0, min_open=True), default=None, metavar="S",
              help="Seconds per worker after which remaining configurations are 'not-run'.")
@click.option("--serial", is_flag=True, help="Run the processes one after another "
              "(default: concurrently).")
@click.option("--workdir", default=None,
              help="Keep worker specs, records and logs here (default: a temporary directory).")
@click.option("--list-configs", is_flag=True, help="List the selected configurations and exit.")
def command(runs, processes, configs, manifest, against, strict_env, json_out, default_mode,
            default_runs, devices, gpus, gpu_timeout, timing, timing_reps, backend, guard_bytes,
            time_budget, serial, workdir, list_configs):
    """Bitwise reproducibility of FA4's deterministic backward (dQ, dK, dV, dsink).

    \b
    One GPU, three fresh processes, 100 runs each:  fa4verify determinism
    Every GPU of a node, one process per GPU:       fa4verify determinism --gpus all --processes 1
    Exit: 0 reproducible, 1 not reproducible / GPUs disagree, 2 usage, 3 a GPU process died,
          5 nothing ran.
    """
    from fa4verify import determinism as d
    from fa4verify.determinism import workers

    if runs < 1:
        raise usage(f"--runs: must be >= 1, got {runs}")
    if processes < 1:
        raise usage(f"--processes: must be >= 1, got {processes}")
    if default_runs is not None and default_runs < 0:
        raise usage(f"--default-runs: must be >= 0, got {default_runs}")
    if timing_reps < 1:
        raise usage(f"--timing-reps: must be >= 1, got {timing_reps}")
    if guard_bytes is not None and guard_bytes < 16:
        raise usage(f"--guard-bytes: must be >= 16, got {guard_bytes}")
    if strict_env and against is None:
        raise usage("--strict-env needs --against")
    cfg_files = [("--configs", c[1:]) for v in configs for c in v.split(",") if c.strip().startswith("@")]
    inputs = [("--against", against)] + cfg_files
    check_inputs(inputs)
    check_outputs([("--manifest", manifest), ("--json", json_out)], inputs=inputs,
                  allow_dash=("--json",))
    if workdir is not None:
        workdir = check_output_dir("--workdir", workdir)
    default_matrix = "h200" if backend == "fa4" else "cpu"
    try:
        cfgs = d.select_configs(list(configs) or None, default=default_matrix)
    except ValueError as ex:
        raise usage(f"--configs: {ex}") from None
    if list_configs:
        for c in cfgs:
            click.echo(f"{c.name:<28} {c.key()}")
        return
    reference = None
    if against is not None:
        try:
            reference = d.load_manifest(against)
        except ValueError as ex:
            raise usage(f"--against: {ex}") from None
    if backend not in ("fa4", "torch-math") and not backend.startswith("twin") and ":" not in backend:
        raise usage(f"--backend: unknown backend {backend!r}")

    gpu_sel = None
    if gpus is not None:
        gpu_sel = _select_gpus(gpus, devices, timing, backend, serial)
    elif gpu_timeout is not None:
        raise usage("--gpu-timeout needs --gpus")
    be = None
    if gpu_sel is None:
        # environment check in this process: no GPU -> exit 2 with the reason
        try:
            be = d.load_backend(backend)
        except EnvironmentError as ex:
            _err(str(ex))
        except (ImportError, AttributeError, ValueError) as ex:
            _err(f"backend {backend!r} unavailable: {type(ex).__name__}: {ex}")
        try:
            devs = d.resolve_devices(devices or "", be.name)
        except ValueError as ex:
            raise usage(f"--devices: {ex}") from None
    else:
        from fa4verify.determinism.multi import device_label
        devs = [device_label(g) for g in gpu_sel]
    ndef = (runs if default_runs is None else default_runs) if default_mode else 0

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="fa4v-det-")
        workdir = tmp.name
    try:
        t0 = time.monotonic()
        spec = d.worker_spec(backend, cfgs, devs, runs=runs, default_runs=ndef, guard_bytes=guard_bytes,
                             time_budget_s=time_budget)
        click.echo(f"running {len(cfgs)} configuration(s) x {runs} runs x {processes} process(es)"
                   f" x {len(devs)} {'GPU process group(s)' if gpu_sel else 'device(s)'} "
                   f"[{backend}]", err=True)
        cross = None
        if gpu_sel is None:
            records = d.spawn_workers(spec, processes, os.path.join(workdir, "matrix"),
                                      parallel=not serial)
        else:
            from fa4verify.determinism import multi
            records = multi.run_on_gpus(spec, gpu_sel, processes, os.path.join(workdir, "gpus"),
                                        timeout_s=gpu_timeout)
        env_fatal = [r["fatal"] for r in records
                     if r.get("fatal") and r.get("fatal_kind") == "environment"]
        if env_fatal and (gpu_sel is None or len(env_fatal) == len(records)):
            _err(env_fatal[0])
        timing_recs: list[dict] = []
        if timing:
            tspec = d.worker_spec(backend, [], devs[:1], runs=1, default_runs=0, timing=True,
                                  timing_configs=d.TIMING_CONFIGS, timing_reps=timing_reps)
            trec = d.spawn_workers(tspec, 1, os.path.join(workdir, "timing"))[0]
            timing_recs = trec.get("timing", [])
            if trec.get("fatal"):
                timing_recs.append({"name": "timing", "status": "error",
                                    "reason": trec["fatal"]})
        report = d.aggregate(records, cfgs)
        if gpu_sel is not None:
            cross = multi.cross_gpu(report, records, gpu_sel, processes)
            report["cross_gpu"] = cross
            report["counts"] = {s: n for s, n in
                                ((s, sum(1 for c in report["configs"] if c["status"] == s))
                                 for s in d.STATUSES) if n}
        fatal = [r["fatal"] for r in records if r.get("fatal")]
        env = next((e for r in records for e in (r.get("environment") or {}).values() if e), {})
        if not env and be is not None:
            env = be.environment(devs[0])
        env = dict(env, backend=backend.split(":")[0] if be is None else be.name) \
            if "backend" not in env else env
        prov = {"command": "fa4verify determinism " + " ".join(sys.argv[2:]) if
                len(sys.argv) > 1 else "fa4verify determinism",
                "date": workers._now(), "git_commit": d.git_commit(), "runs": runs,
                "processes": processes, "devices": devs, "default_runs": ndef,
                "where": report.get("where"), "seconds": round(time.monotonic() - t0, 1)}
        report.update(environment=env, environments={r.get("process_index"): r.get("environment")
                                                      for r in records},
                      provenance=prov, timing=timing_recs, worker_fatal=fatal)
        man = d.build_manifest(report, env, provenance=prov)
        if cross is not None:
            man.update(multi.manifest_extra(report, cross, records))
        cmp_ = d.compare_manifests(man, reference, strict_env=strict_env) if reference else None
        report["against"] = cmp_
        outs = []
        if manifest is not None:
            outs.append((manifest, json_bytes(man, sort_keys=True)))
        if json_out is not None:
            text = json_bytes(report, sort_keys=True)
            if json_out == "-":
                click.echo(text.decode().rstrip("\n"))
            else:
                outs.append((json_out, text))
        write_outputs(outs)
        if json_out != "-":
            _print_report(report, cmp_, timing_recs)
            if cross is not None:
                click.echo(f"cross-GPU: {cross['status']}")
                for line in cross["evidence"]:
                    click.echo(f"    {line}")
        for f_ in fatal:
            click.echo(f"worker failure: {f_}", err=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    code = d.exit_status(report)
    if cross is not None and cross["status"] == "fail":
        code = int(ExitCode.VIOLATION)
    elif cross is not None and cross["status"] == "error" and not any(
            c["status"] in ("not-reproducible", "guard-violation", "unwritten")
            for c in report["configs"]):
        code = int(ExitCode.INTERNAL)     # a GPU process died: an error, not a violation found
    if fatal and code == 0:
        code = int(ExitCode.VIOLATION)
    if cmp_ is not None and cmp_["failed"]:
        code = int(ExitCode.VIOLATION)
    raise click.exceptions.Exit(code)
