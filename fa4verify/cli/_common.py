"""What every ``fa4verify`` subcommand shares: one-line usage errors, option types that refuse
non-finite or negative values, and the output/input path checks (on top of
:mod:`fa4verify.audit.atomic`).

Convention (every subcommand): bad input or an unusable environment is ONE line on stderr,
``fa4verify <command>: error: <what, quoting the value>``, and exit 2, before any work; every
output path is validated before any work and written all-or-none at the end.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import click


#: Note [Error lines are bounded]: an error line quotes the user's input (a file name, a value, a
#: whole bad TOML table); it is cut at this many characters (+ "…") and its control characters
#: are written as escapes, so 830 KB of input or an ESC sequence never reaches the terminal raw.
MAX_ERROR_CHARS = 500


def error_line(message: str) -> str:
    """``message`` as one bounded, printable line (Note [Error lines are bounded])."""
    from fa4verify.audit.terminal import printable

    line = printable(str(message))
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS] + "…"


class OneLineUsageError(click.ClickException):
    """Bad input or unusable environment: one line on stderr, exit 2 (ExitCode.USAGE)."""

    exit_code = 2

    def __init__(self, message: str, prog: str = "fa4verify audit") -> None:
        super().__init__(message)
        self.prog = prog

    def show(self, file=None) -> None:  # noqa: D102 - click API
        click.echo(f"{self.prog}: error: {error_line(self.format_message())}", err=True)


def usage(msg: str, prog: str | None = None) -> OneLineUsageError:
    """A :class:`OneLineUsageError` for the current command (its path names the program)."""
    if prog is None:
        ctx = click.get_current_context(silent=True)
        prog = ctx.command_path if ctx is not None else "fa4verify"
    return OneLineUsageError(msg, prog=prog)


def _prog(parent, info_name) -> str:
    if parent is not None:
        return f"{parent.command_path} {info_name}"
    return f"fa4verify {info_name}"


def _one_line(e: click.UsageError, prog: str) -> OneLineUsageError:
    if isinstance(e, OneLineUsageError):
        return e
    return OneLineUsageError(e.format_message(), prog=prog)


class OneLineCommand(click.Command):
    """A click command whose errors -- parse errors (unknown option, bad value) and usage errors
    raised while it runs, path errors included -- are one line, exit 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise _one_line(e, _prog(parent, info_name)) from None

    def invoke(self, ctx):
        from fa4verify.error_budgets.input_files import InputPathError
        from fa4verify.errors import OutputPathError

        try:
            rv = super().invoke(ctx)
        except click.UsageError as e:
            raise _one_line(e, ctx.command_path) from None
        except (OutputPathError, InputPathError) as e:
            raise OneLineUsageError(str(e), prog=ctx.command_path) from None
        if isinstance(rv, int) and not isinstance(rv, bool) and rv != 0:
            # a returned exit code is dropped by click in standalone mode (CliRunner, a plain
            # ``command()`` call): raise it, so every caller sees the verdict
            raise click.exceptions.Exit(rv)
        return rv


class OneLineGroup(click.Group):
    """A click group with one-line errors (see :class:`OneLineCommand`)."""

    command_class = OneLineCommand

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise _one_line(e, _prog(parent, info_name)) from None

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            raise _one_line(e, _prog(ctx.parent, ctx.info_name)) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise _one_line(e, ctx.command_path) from None


class FiniteFloat(click.ParamType):
    """A float that must be finite (no nan/inf) and, optionally, >= ``min`` (> with
    ``min_open``)."""

    name = "float"

    def __init__(self, min: float | None = None, min_open: bool = False) -> None:
        self.min, self.min_open = min, min_open

    def convert(self, value, param, ctx):
        if isinstance(value, float) and math.isfinite(value):
            v = value
        else:
            try:
                v = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r}: must be a finite number", param, ctx)
        if self.min is not None and (v <= self.min if self.min_open else v < self.min):
            self.fail(f"{value!r}: must be {'>' if self.min_open else '>='} {self.min:g}",
                      param, ctx)
        return v


def check_outputs(pairs: Iterable[tuple[str, "str | None"]], *,
                  inputs: Iterable[tuple[str, "str | None"]] = (),
                  allow_dash: Sequence[str] = (), prog: str | None = None,
                  duplicate_message: str | None = None) -> None:
    """:func:`fa4verify.audit.atomic.check_outputs` as a one-line usage error (exit 2)."""
    from fa4verify.audit.atomic import check_outputs as _check
    from fa4verify.errors import OutputPathError

    try:
        _check(pairs, inputs=inputs, allow_dash=allow_dash, duplicate_message=duplicate_message)
    except OutputPathError as e:
        raise usage(str(e), prog) from None


def check_output_dir(opt: str, path, *, prog: str | None = None) -> str:
    from fa4verify.audit.atomic import check_output_dir as _check
    from fa4verify.errors import OutputPathError

    try:
        return _check(opt, path)
    except OutputPathError as e:
        raise usage(str(e), prog) from None


def check_inputs(pairs: Iterable[tuple[str, "str | None"]], *, prog: str | None = None) -> None:
    """Each ``(option, path)`` input is a readable regular file of bounded size (exit 2 else)."""
    from fa4verify.error_budgets.input_files import InputPathError, check_readable

    for opt, p in pairs:
        if p is None:
            continue
        try:
            check_readable(p)
        except InputPathError as e:
            raise usage(f"{opt} {e}", prog) from None


def write_outputs(outputs: Iterable[tuple[str, bytes]]) -> None:
    """All-or-none write of ``(path, bytes)`` (:func:`fa4verify.audit.atomic.write_all`)."""
    from fa4verify.audit.atomic import write_all

    write_all([(p, d) for p, d in outputs if p is not None])


def json_safe(o):
    """JSON has no NaN/inf: non-finite floats become the strings "nan", "inf", "-inf"; numpy
    scalars become Python numbers."""
    if isinstance(o, float):
        if math.isfinite(o):
            return o
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    if hasattr(o, "item") and callable(o.item):
        try:
            return json_safe(o.item())
        except (TypeError, ValueError):
            return str(o)
    return o


def json_bytes(obj, *, indent: int = 1, sort_keys: bool = False) -> bytes:
    """Strict JSON (no bare NaN) of ``obj``, newline-terminated, as UTF-8 bytes."""
    import json

    return (json.dumps(json_safe(obj), indent=indent, sort_keys=sort_keys, allow_nan=False,
                       default=str) + "\n").encode("utf-8")
