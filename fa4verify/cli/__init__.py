"""The ``fa4verify`` command line.

Each subcommand lives in its own module ``fa4verify/cli/<name>.py`` exposing a click command
called ``command``; modules are imported lazily so ``fa4verify --help`` stays fast and a broken
optional dependency of one subcommand cannot break the others.

Exit codes (``ExitCode``) reuse pytest's meanings where they overlap.
"""
from __future__ import annotations

import enum
import importlib
import importlib.util
import os
import sys

import click

from fa4verify import __version__


class ExitCode(enum.IntEnum):
    OK = 0               #: everything checked is within budget
    VIOLATION = 1        #: a budget, bit-exactness or determinism violation
    USAGE = 2            #: bad input, unusable environment (no GPU for --device cuda, ...)
    INTERNAL = 3         #: a bug in fa4verify itself
    NOTHING_RAN = 5      #: no check ran (never reported as success)
    UNDECIDED = 10       #: a certified comparison could not decide (interval too wide)


#: SIGINT (Ctrl-C): 128 + SIGINT, the shell's convention; files written earlier stay intact.
INTERRUPTED = 130


# name -> (module, short help). Keep alphabetical.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "audit": ("fa4verify.cli.audit", "Run every check, write reports, gate a release."),
    "budgets": ("fa4verify.cli.budgets", "Show and validate the per-stage error budgets."),
    "determinism": ("fa4verify.cli.determinism", "Bitwise reproducibility of FA4's deterministic backward."),
    "exp2": ("fa4verify.cli.exp2", "Certify FA4's polynomial exp2 emulation over all fp32 inputs."),
    "fuzz": ("fa4verify.cli.fuzz", "Hypothesis fuzzing of shapes, masks and values."),
    "mutants": ("fa4verify.cli.mutants", "Measure what fa4verify (and the field's rules) catch."),
    "report": ("fa4verify.cli.report", "Merge and inspect audit reports."),
    "sass": ("fa4verify.cli.sass", "Compile-only instruction census of FA4 for sm_90a / sm_100a."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(n for n, (mod, _) in SUBCOMMANDS.items() if importlib.util.find_spec(mod))

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return None
        mod_name, _ = SUBCOMMANDS[name]
        if importlib.util.find_spec(mod_name) is None:
            return None
        mod = importlib.import_module(mod_name)
        return mod.command

    def format_commands(self, ctx, formatter):
        rows = [(n, SUBCOMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fa4verify")
def cli():
    """fa4verify: numerical-accuracy verification for FlashAttention-4.

    \b
    Every figure it prints says where it was obtained:
      measured on H200   production FA4 (SM90 kernels) or a probe kernel on a GPU
      CPU twin           bit-exact numpy model of FA4's stages (SM90 / SM100 numerics)
      compile-only       PTX/SASS compiled for sm_90a / sm_100a on this machine

    \b
    Start with:
      fa4verify audit --dtype bf16        everything, with a verdict and exit code
      fa4verify exp2 --degree all         the exp2 polynomial certification alone
    Exit codes: 0 within budget, 1 violation, 2 usage/environment error, 5 nothing ran.
    """


def debug_enabled() -> bool:
    """``$FA4VERIFY_DEBUG`` asks for tracebacks: set and not 0/false/no/off (``FA4VERIFY_DEBUG=0``
    means off)."""
    return os.environ.get("FA4VERIFY_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def main(argv=None) -> int:
    """Console entry point: never lets a traceback reach a user for bad input."""
    if argv is None:            # the console command, not an in-process call
        from fa4verify.run import bytecode
        bytecode.enable()       # Note [Bytecode cache]: before anything imports torch or FA4
    try:
        rv = cli.main(args=argv, prog_name="fa4verify", standalone_mode=False)
    except click.exceptions.Abort as e:
        if isinstance(e.__context__, KeyboardInterrupt):
            click.echo("fa4verify: interrupted", err=True)
            return INTERRUPTED
        click.echo("fa4verify: aborted", err=True)
        return int(ExitCode.USAGE)
    except click.UsageError as e:  # one line, as every subcommand's (fa4verify.cli._common)
        from fa4verify.cli._common import OneLineUsageError

        if not isinstance(e, OneLineUsageError):
            prog = e.ctx.command_path if e.ctx is not None else "fa4verify"
            e = OneLineUsageError(e.format_message(), prog=prog)
        e.show()
        return int(ExitCode.USAGE)
    except click.ClickException as e:
        e.show()
        return int(ExitCode.USAGE)
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except KeyboardInterrupt:
        click.echo("fa4verify: interrupted", err=True)
        return INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as e:  # pragma: no cover - last resort
        if debug_enabled():
            raise
        from fa4verify.cli._common import error_line
        click.echo(f"fa4verify: internal error: {error_line(f'{type(e).__name__}: {e}')} "
                   "(set FA4VERIFY_DEBUG=1 for the traceback)", err=True)
        return int(ExitCode.INTERNAL)
    return int(rv or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
