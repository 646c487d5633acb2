"""``fa4verify mutants``: measure what fa4verify -- and the field's usual rules -- catch.

Plants the catalogue of numeric faults (``fa4verify.mutants.CATALOGUE``) into the CPU twin of
FA4 and prints a detection table: mutant x verifier, caught / missed, with the deciding figure
(measured/threshold for tolerance rules, a count for bitwise and determinism checks).
``--target production`` runs the production kernels on a GPU instead, covering only the faults
FA4 lets a caller express through its public API (``fa4verify.mutants.PRODUCTION_KNOBS``).

Exit status: 0 when fa4verify catches every mutant it was given and raises no false alarm on
the unmutated twin; 1 otherwise; 2 for bad options or a missing twin/GPU.
"""
from __future__ import annotations

import click

from fa4verify.cli import ExitCode
from fa4verify.cli._common import OneLineCommand, check_inputs, check_outputs, usage
from fa4verify import errors

_PROFILES = ("quick", "full")


def _parse_list(values: tuple[str, ...], known: tuple[str, ...], what: str) -> list[str] | None:
    names: list[str] = []
    for v in values:
        names.extend(x.strip() for x in v.split(",") if x.strip())
    if not names:
        return None
    bad = [n for n in names if n not in known]
    if bad:
        raise usage(f"--{what}: unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    return names


@click.command("mutants", cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]},
               short_help="Measure what fa4verify (and the field's rules) catch.")
@click.option("--profile", type=click.Choice(_PROFILES), default="quick", show_default=True,
              help="Battery size: quick (tiny shapes, CI; ~2 min on one core) or full.")
@click.option("--json", "json_path", default=None, metavar="FILE",
              help="Also write the full result as JSON.")
@click.option("--markdown", "md_path", default=None, metavar="FILE",
              help="Also write the table as markdown.")
@click.option("--seed", type=int, default=0, show_default=True, metavar="N",
              envvar="FA4VERIFY_SEED", help="Seed of the battery's inputs. Env: FA4VERIFY_SEED.")
@click.option("--arch", "archs", multiple=True, type=click.Choice(("sm90", "sm100")),
              help="Twin arch(es) to mutate (repeatable). Default: sm90 and sm100.")
@click.option("--mutant", "mutant_opts", multiple=True, metavar="NAME[,NAME]",
              help="Only these mutants (repeatable or comma-separated). Default: all.")
@click.option("--verifier", "verifier_opts", multiple=True, metavar="NAME[,NAME]",
              help="Only these verifiers (repeatable or comma-separated). Default: all.")
@click.option("--target", type=click.Choice(("twin", "production")), default="twin",
              show_default=True,
              help="twin: the CPU twin (any machine). production: FA4 on the local GPU: the "
                   "knob-expressible mutants, then the kernel-source mutants (--source-dir).")
@click.option("--source-dir", "source_dir", default=None, metavar="DIR",
              help="With --target production: where the kernel-source mutants (faults patched "
                   "into private, fingerprinted copies of the installed flash_attn/cute, "
                   "fa4verify.mutants.source) write source_mutants.json/.txt. Default: a new "
                   "temporary directory.")
@click.option("--source-jobs", type=click.IntRange(1, 64), default=8, show_default=True,
              metavar="N", help="Source mutants compiled and run side by side.")
@click.option("--no-source", is_flag=True,
              help="With --target production: skip the kernel-source mutants.")
@click.option("--from-json", "from_json", default=None, metavar="FILE",
              help="Render a saved --json result (e.g. a production run made on a GPU machine) "
                   "instead of running.")
@click.option("--list", "list_only", is_flag=True, help="List mutants and verifiers, run nothing.")
@click.option("-q", "--quiet", is_flag=True, help="No per-case progress lines on stderr.")
def command(profile, json_path, md_path, seed, archs, mutant_opts, verifier_opts, target,
            source_dir, source_jobs, no_source, from_json, list_only, quiet):
    """Run fa4verify's verification on each planted numeric mutant of FA4 and print which
    verifiers catch it, side by side with FlashAttention's upstream rule and
    torch.testing.assert_close defaults.

    \b
    Examples:
      fa4verify mutants                       quick battery, CPU twin, both archs
      fa4verify mutants --profile full --json mutants.json --markdown table.md
      fa4verify mutants --target production   on a GPU (H200: SM90 kernels), with the
                                              kernel-source mutants of the installed FA4
    """
    from fa4verify import mutants as M
    from fa4verify.audit.atomic import staged

    check_inputs([("--from-json", from_json)])
    check_outputs([("--json", json_path), ("--markdown", md_path)],
                  inputs=[("--from-json", from_json)])
    if source_dir is not None:
        import os
        if os.path.exists(source_dir) and not os.path.isdir(source_dir):
            raise usage(f"--source-dir {source_dir}: exists and is not a directory")
        if target != "production":
            raise usage("--source-dir: kernel-source mutants run only with --target production")
    if list_only:
        for m in M.CATALOGUE:
            knob = f"  [production: {m.production}]" if m.production else ""
            click.echo(f"{m.name:22s} {','.join(m.archs):11s} {m.title}{knob}")
        for s in M.verifiers():
            click.echo(f"verifier {s.name:18s} [{s.group}] {s.title}")
        return int(ExitCode.OK)
    mutants = _parse_list(mutant_opts, M.MUTANT_NAMES, "mutant")
    vnames = _parse_list(verifier_opts, tuple(s.name for s in M.verifiers()), "verifier")
    say = (lambda s: None) if quiet else (lambda s: click.echo(f"  {s}", err=True))
    argv = " ".join(["fa4verify mutants", f"--profile {profile}", f"--seed {seed}"]
                    + [f"--arch {a}" for a in archs]
                    + ([f"--mutant {','.join(mutants)}"] if mutants else [])
                    + ([f"--verifier {','.join(vnames)}"] if vnames else [])
                    + ([f"--target {target}"] if target != "twin" else []))
    if from_json:
        try:
            res = M.read_json(from_json)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise usage(f"--from-json {from_json}: {exc}") from None
        M.render_rich(res)
        with staged({"json": json_path, "md": md_path}) as tmp:
            if "json" in tmp:
                M.write_json(res, tmp["json"])
            if "md" in tmp:
                with open(tmp["md"], "w", encoding="utf-8") as f:
                    f.write(M.render_markdown(res, f"fa4verify mutants (from {from_json})"))
        return int(M.exit_code(res))
    if target == "twin" and M.twin_module() is None:
        click.echo("fa4verify mutants: the CPU twin (fa4verify.kernels.twin.attention) is not "
                   "installed; nothing to mutate", err=True)
        return int(ExitCode.USAGE)
    try:
        res = M.run_suite(profile, seed=seed, archs=tuple(archs) or ("sm90", "sm100"),
                          mutants=mutants, verifier_names=vnames, progress=say, target=target)
    except errors.DependencyMissing as exc:
        click.echo(f"fa4verify mutants: {exc}", err=True)
        return int(ExitCode.USAGE)
    M.render_rich(res)
    with staged({"json": json_path, "md": md_path}) as tmp:
        if "json" in tmp:
            M.write_json(res, tmp["json"])
        if "md" in tmp:
            with open(tmp["md"], "w", encoding="utf-8") as f:
                f.write(M.render_markdown(res, argv))
    code = int(M.exit_code(res))
    if target == "production" and not no_source and not mutants and not vnames:
        import tempfile

        from fa4verify.mutants import source_run
        out = source_dir or tempfile.mkdtemp(prefix="fa4verify-source-mutants-")
        click.echo(f"kernel-source mutants of the installed FA4 -> {out}", err=True)
        rc = source_run.main(["--out", out, "--device", "cuda", "--jobs", str(source_jobs)])
        code = max(code, int(rc))
    return code
