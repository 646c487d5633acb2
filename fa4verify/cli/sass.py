"""``fa4verify sass``: compile-only instruction census of production FA4 (no GPU needed).

Compiles FA4's forward (and backward with ``--backward``) for ``--arch`` in a subprocess under
torch FakeTensorMode, keeps PTX and SASS, and prints per-kernel instruction counts, the exp2
emulated share read from the PTX, and whether it equals the twin's column rule.

Exit codes: 0 counts produced (and, on SM100, the PTX-derived emulated columns equal the twin's),
1 the PTX-derived columns differ from the twin's rule, 2 bad input or FA4 missing / compile
failed, 3 internal error.
"""
from __future__ import annotations

import sys

import click

from fa4verify.cli._common import OneLineCommand, check_output_dir, check_outputs, usage, write_outputs

_KEY_PTX = ("ex2.approx.ftz.f32", "add.rm.f32x2 (emulation floor, pair)", "add.rm.ftz.f32 (emulation floor)",
            "fma.rn.f32x2", "poly3 c3 0f3D9DF09D", "lg2.approx.ftz.f32", "rcp.approx.ftz.f32",
            "cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32", "cvt.rz/rm/rp to 16-bit", "mul.f32 (contractible)",
            "sub.f32 (contractible)", ".ftz (any)")
_KEY_SASS = ("MUFU.EX2", "FFMA", "FFMA with negated addend", "FFMA2", "FADD2.RM", "FADD.FTZ.RM",
             "MUFU.RCP", "MUFU.LG2", "F2FP.BF16", "F2FP.F16", "HGMMA", "UTC*MMA")


def _check_head_dim(arch: str, hd: int, hdv: int | None) -> int | None:
    """FA4's own head-dim rule (``fa4verify.strategies.head_dim_supported``), checked here so a bad
    pair is one line, never FA4's traceback from the compile subprocess."""
    from fa4verify._strategies.shapes import head_dim_supported
    if hdv is None:
        hdv_eff = 128 if (arch == "sm_100a" and hd == 192) else hd
    else:
        hdv_eff = hdv
    from fa4verify.kernels.facts import arch_of_ptx_target
    a = arch_of_ptx_target(arch)
    if hd < 1 or hdv_eff < 1 or not head_dim_supported(a, hd, hdv_eff):
        rule = ("both multiples of 8 in 8..256" if a == "sm90" else
                "both multiples of 8 in 8..128, or (192, 128), or (256, 256)")
        raise usage(f"--head-dim {hd} --head-dim-v {hdv if hdv is not None else hdv_eff}: "
                    f"not supported by FA4 on {arch} ({rule})")
    return hdv if hdv is not None else (128 if (arch == "sm_100a" and hd == 192) else None)


@click.command("sass", cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--arch", type=click.Choice(["sm_90a", "sm_100a"]), required=True,
              help="Compile target (FLASH_ATTENTION_ARCH and CUTE_DSL_ARCH are set to match).")
@click.option("--head-dim", "head_dim", type=int, required=True, metavar="D", help="Head dim of q/k.")
@click.option("--head-dim-v", "head_dim_v", type=int, default=None, metavar="DV",
              help="Head dim of v (default: D; 128 for D=192 on sm_100a).")
@click.option("--causal/--no-causal", default=False, help="Causal mask.  Default: non-causal.")
@click.option("--backward", is_flag=True, help="Also compile the backward kernels.")
@click.option("--deterministic/--no-deterministic", default=False,
              help="Deterministic backward (--deterministic implies --backward).  Default: FA4's default mode.")
@click.option("--atomics", is_flag=True,
              help="Also print the backward's floating-point atomics (dQ fp32 bulk reduce-add) and the "
                   "semaphore ops that order them, per kernel, with their PTX lines / SASS offsets "
                   "(implies --backward; fa4verify.compile.census_atomics).")
@click.option("--seqlen", type=int, default=1024, show_default=True,
              help="Sequence length of the fake tensors (> 256 lets SM100 use 2-CTA).")
@click.option("--exp2-emulation/--no-exp2-emulation", "emulation", default=True,
              help="--no-exp2-emulation compiles with FA4's exp2 emulation switched off through the "
                   "tuning table (adapter.exp2_emulation_disabled).  Default: FA4's default.")
@click.option("--json", "json_path", default=None,
              metavar="F", help="Write the full census as JSON to F ('-': stdout gets the JSON "
                                "alone, the table goes to stderr).")
@click.option("--keep-dir", default=None,
              help="Keep the PTX/SASS dumps in this directory (default: a temp dir).")
def command(arch, head_dim, head_dim_v, causal, backward, deterministic, atomics, seqlen, emulation, json_path,
            keep_dir):
    """Compile-only instruction census of FA4 for sm_90a / sm_100a (every figure: compile-only)."""
    from fa4verify.cli import ExitCode
    head_dim_v = _check_head_dim(arch, head_dim, head_dim_v)
    if seqlen < 1:
        raise usage(f"--seqlen: must be >= 1, got {seqlen}")
    check_outputs([("--json", json_path)], allow_dash=("--json",))
    if keep_dir is not None:
        keep_dir = check_output_dir("--keep-dir", keep_dir)
    import importlib.util
    if importlib.util.find_spec("flash_attn") is None or importlib.util.find_spec("cutlass") is None:
        raise usage("flash-attn-4 / nvidia-cutlass-dsl not installed (pip install 'fa4verify[fa4]')")
    from fa4verify.compile import census as C
    case = C.CensusCase(arch, head_dim, causal=causal, backward=backward or deterministic or atomics,
                        deterministic=deterministic, head_dim_v=head_dim_v, seqlen=seqlen,
                        exp2_emulation=emulation)
    try:
        res = C.compile_case(case, keep_dir)
    except (RuntimeError, FileNotFoundError) as e:
        msg = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        # one line: the compile subprocess's last line says what FA4 rejected
        last = msg[-1] if msg else str(e)
        raise usage(f"compile failed: {msg[0] if msg else e}" + (f" ... {last}" if len(msg) > 1 else ""))
    cen = C.census_case(res)
    _print(cen, to_stderr=json_path == "-")
    if atomics:
        from fa4verify.compile import census_atomics as A
        cen["atomics"] = A.atomics_census(res)
        _print_atomics(cen["atomics"], to_stderr=json_path == "-")
    if json_path is not None:
        from fa4verify.cli._common import json_bytes
        text = json_bytes(cen)
        if json_path == "-":
            click.echo(text.decode().rstrip("\n"))
        else:
            write_outputs([(json_path, text)])
    if cen.get("ptx_matches_twin") is False:
        raise click.exceptions.Exit(int(ExitCode.VIOLATION))


def _print(cen: dict, to_stderr: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table
    con = Console(file=sys.stderr if to_stderr else sys.stdout, width=120)
    fc = cen["forward_config"]
    con.print(f"[bold]FA4 instruction census[/bold] {cen['label']}  (compile-only; "
              f"compile {cen['compile_seconds']} s)")
    con.print(f"kernel family sm_{fc.get('arch')}, tile {fc.get('tile_mn')}, 2-CTA {fc.get('use_2cta')}, "
              f"pack_gqa {fc.get('pack_gqa')}, tuning key {fc.get('tuning_key')}")
    for name, e in cen["kernels"].items():
        short = name.split("object_at")[0].replace("cutlass___call___", "")[:70]
        t = Table(title=short, show_header=True, header_style="bold")
        t.add_column("PTX")
        t.add_column("count", justify="right")
        t.add_column("SASS")
        t.add_column("count", justify="right")
        p = [(k, e["ptx"].get(k, 0)) for k in _KEY_PTX]
        s = [(k, (e["sass"] or {}).get(k, 0)) for k in _KEY_SASS]
        for i in range(max(len(p), len(s))):
            a = p[i] if i < len(p) else ("", "")
            b = s[i] if i < len(s) else ("", "")
            t.add_row(a[0], str(a[1]), b[0], str(b[1]))
        con.print(t)
    if "emulation_from_ptx" in cen:
        d = cen["emulation_from_ptx"]
        con.print(f"exp2 per KV tile from PTX: {d['tile_copies']} unrolled softmax copies, emulated "
                  f"columns {d['emulated_columns']} -> share {d['share']:.4f}; "
                  f"{d['extra_hardware_ex2']} hardware ex2 outside the tile runs")
        con.print(f"twin rule (emulated_columns): share {cen.get('twin_share')}, columns "
                  f"{cen.get('twin_emulated_columns')}  -> match: {cen.get('ptx_matches_twin')}")
    if cen.get("ffma_negated_addend") is not None and str(fc.get("arch")) == "90":
        con.print(f"SM90 exponent argument S*c - m*c: {cen['ffma_negated_addend']} FFMA with negated "
                  f"addend in SASS (ptxas contraction of PTX mul.f32 + sub.f32)")


def _print_atomics(at: dict, to_stderr: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from fa4verify.compile import census_atomics as A
    con = Console(file=sys.stderr if to_stderr else sys.stdout, width=120)
    mode = "deterministic=True" if at["deterministic"] else "deterministic=False (default)"
    t = Table(title=f"backward atomics, {at['arch']}, {mode} (compile-only; static instruction sites)",
              header_style="bold")
    names = list(at["kernels"])
    t.add_column("instruction class")
    for n in names:
        t.add_column(f"{n.replace('FlashAttention', '')}\n({at['kernels'][n]['role']})", justify="right")
    for key in A.PTX_KEYS:
        t.add_row(escape("PTX " + key.strip()), *(str(at["kernels"][n]["ptx"]["counts"][key]) for n in names))
    for key in A.SASS_KEYS:
        t.add_row(escape("SASS " + key), *(str(((at["kernels"][n]["sass"] or {}).get("counts") or {}).get(key, 0))
                                        for n in names))
    con.print(t)
    for name, k in at["kernels"].items():
        if k["role"] != "bwd main":
            continue
        con.print(f"[bold]{name}[/bold] PTX sites (line: instruction):")
        for ln, cat, ins in k["ptx"]["sites"]:
            con.print(escape(f"  {ln:>6}: {ins}   [{cat}]"))
        if k["sass"]:
            con.print(escape("  SASS (offset:opcode): " + ", ".join(f"{o}:{op}" for o, _, op in k["sass"]["sites"])))
