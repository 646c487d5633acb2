"""Audit options shared by the ``fa4verify audit`` CLI and the pytest plugin (``--fa4-*``).

One table (:data:`OPTIONS`) describes every option once; :func:`click_options` turns it into
click options for the CLI and :func:`add_pytest_options` into ``--fa4-<name>`` pytest options.
The parsers (:func:`parse_shard`, :func:`resolve_device`, :func:`resolve_archs`, ...) raise
:class:`OptionError` with a one-line message quoting the bad value; the CLI turns it into
``click.UsageError`` (exit 2), the plugin into ``pytest.UsageError``.

Importing this module is light (no torch, numpy, click or pytest import at module level).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Sequence

from fa4verify.audit.registry import ARCHS, DTYPES, PROFILE_ORDER, cuda_available
from fa4verify.kernels.device import FAKE_DEVICES as _FAKE_GPUS
from fa4verify.errors import OptionError

DEVICES = ("auto", "cpu", "cuda")
#: Note [Fake device]: what ``--fake-device`` takes
FAKE_DEVICES = tuple(_FAKE_GPUS)
ARCH_CHOICES = ("auto",) + ARCHS
ISOLATE = ("auto", "always", "never")

#: Environment variable with extra check modules (dotted names or .py paths, os.pathsep-separated).
CHECKS_MODULES_ENV = "FA4VERIFY_CHECKS_MODULES"


@dataclasses.dataclass(frozen=True)
class Option:
    """One shared option. ``name`` is the CLI long name (``--name``) and the pytest name
    (``--fa4-name``); ``dest`` the keyword the CLI function and :class:`AuditConfig` use."""

    name: str
    dest: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: type | None = None
    metavar: str | None = None
    multiple: bool = False
    flag: bool = False
    envvar: str | None = None   #: environment variable giving the default (README)


OPTIONS: tuple[Option, ...] = (
    Option("dtype", "dtype", "Input dtype audited.", "bf16", choices=DTYPES),
    Option("device", "device", "Where production checks run; auto = cuda if available.", "auto",
           choices=DEVICES),
    Option("arch", "arch", "Architecture(s) audited; auto = the GPU's, or sm90 and sm100 twins on "
           "a CPU machine. Repeatable.", ("auto",), choices=ARCH_CHOICES, multiple=True),
    Option("profile", "profile", "Amount of work per check.", "default", choices=PROFILE_ORDER),
    Option("seed", "seed", "Seed of every random stream (per-check streams are derived from it); "
           "env FA4VERIFY_SEED.", 0, type=int, metavar="N", envvar="FA4VERIFY_SEED"),
    Option("shard", "shard", "Run only shard I of N (deterministic partition of check ids).",
           None, metavar="I/N"),
    Option("checks-module", "checks_modules", "Extra check module (dotted name or .py path); "
           f"repeatable; also ${CHECKS_MODULES_ENV}.", (), metavar="MOD", multiple=True),
    Option("no-default-checks", "no_default_checks", "Do not discover fa4verify.checks (only "
           "--checks-module modules).", False, flag=True),
    Option("isolate", "isolate", "Run checks in a worker subprocess: auto = checks that need "
           "cuda; always; never.", "auto", choices=ISOLATE),
    Option("timeout", "timeout", "Time limit in seconds of each isolated task (a check, or a group "
           "of its cases): a task past it is killed with its worker and its check is an error naming "
           "the case; auto = on a GPU max(300, 5 x the check's cost), none on the CPU; 0 = none.",
           "auto", metavar="S|auto"),
    Option("workers", "workers", "Persistent worker processes for isolated checks, run side by side; "
           "auto = every CPU core but one, at most 15, on a GPU (FA4 compiles are CPU work), 2 on "
           "the CPU. Env FA4VERIFY_WORKERS.",
           "auto", metavar="N|auto", envvar="FA4VERIFY_WORKERS"),
    Option("fresh-workers", "fresh_workers", "A new worker process for every isolated check (no "
           "reuse of imports, CUDA context or compiled kernels; slower, the pre-pool behaviour).",
           False, flag=True),
    Option("kernel-cache", "kernel_cache", "FA4's persistent compiled-kernel cache for the workers: "
           "a directory, 'auto' (<FA4VERIFY_CACHE_DIR or .fa4verify-cache>/fa4-kernels) or 'off'. "
           "Ignored when FLASH_ATTENTION_CUTE_DSL_CACHE_* are set.", "auto", metavar="DIR|auto|off"),
    Option("opt", "opts", "Extra key=value passed to checks as ctx.options; repeatable.", (),
           metavar="KEY=VALUE", multiple=True),
    Option("fake-device", "fake_device", "Audit a GPU this machine need not have, compile-only "
           "(Note [Fake device audit]): the CPU checks run as usual; every check that runs FA4 on the "
           "GPU compiles the FA4 calls it would make there (on SM100/SM103 with exp2 emulation on and "
           "off; the kernel cache on) and reports them as 'compile-only' (skip: nothing was measured), "
           "or says why it cannot. Implies --device cuda; needs flash-attn-4 and the CuTe DSL.",
           None, choices=FAKE_DEVICES),
    Option("deployment", "deployment", "Deployment profile (TOML file, or a shipped name: llama3-8b, "
           "swa-sink-hd64, hd256, small-hd, decode-paged): every check draws its cases from what it ships, and "
           "recorded findings apply only where they intersect it.", None, metavar="FILE.toml"),
)


# ------------------------------------------------------------------------------------ parsers
def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"i/n"`` (1 <= i <= n) -> (i, n); None -> None."""
    if text is None or text == "":
        return None
    try:
        a, b = str(text).split("/")
        i, n = int(a), int(b)
    except ValueError:
        raise OptionError(f"--shard {text!r}: expected I/N with integers, e.g. 1/4") from None
    if n < 1 or not 1 <= i <= n:
        raise OptionError(f"--shard {text!r}: need 1 <= I <= N")
    return (i, n)


def resolve_device(device: str, *, cuda: bool | None = None) -> str:
    """``auto`` -> "cuda" if torch.cuda.is_available() else "cpu"; ``cuda`` without a GPU is an
    error."""
    if device not in DEVICES:
        raise OptionError(f"--device {device!r}: choose from {', '.join(DEVICES)}")
    have = cuda_available() if (cuda is None and device != "cpu") else bool(cuda)
    if device == "auto":
        return "cuda" if have else "cpu"
    if device == "cuda" and not have:
        raise OptionError("--device cuda: no CUDA device (torch.cuda.is_available() is False)")
    return device


def _gpu_arch() -> str | None:
    """The local GPU's fa4verify arch (:func:`fa4verify.kernels.device.local_gpu`), or None."""
    from fa4verify.kernels.device import local_gpu
    g = local_gpu()
    return None if g is None else g.arch


def resolve_archs(archs: Sequence[str] | str, device: str) -> tuple[str, ...]:
    """Selected archs; ``auto`` = the GPU's arch on cuda (sm90 if unknown), ("sm90", "sm100") on
    the CPU (the two twins)."""
    if isinstance(archs, str):
        archs = [archs]
    out: list[str] = []
    for a in archs or ("auto",):
        for part in str(a).split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in ARCH_CHOICES:
                raise OptionError(f"--arch {part!r}: choose from {', '.join(ARCH_CHOICES)}")
            if part == "auto":
                ga = _gpu_arch() if device == "cuda" else None
                auto = (ga,) if ga else ("sm90", "sm100")   # an unsupported GPU: the twins; live checks skip
                out.extend(x for x in auto if x not in out)
            elif part not in out:
                out.append(part)
    return tuple(out) or ("sm90", "sm100")


def parse_opts(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items or ():
        if "=" not in it:
            raise OptionError(f"--opt {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        out[k.strip()] = v
    return out


def checks_modules_from_env() -> tuple[str, ...]:
    raw = os.environ.get(CHECKS_MODULES_ENV, "")
    return tuple(p for p in raw.split(os.pathsep) if p.strip())


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """A resolved, validated audit configuration (what the runner needs)."""

    dtype: str = "bf16"
    device: str = "cpu"
    archs: tuple[str, ...] = ("sm90", "sm100")
    profile: str = "default"
    seed: int = 0
    keyword: str | None = None
    shard: tuple[int, int] | None = None
    checks_modules: tuple[str, ...] = ()
    no_default_checks: bool = False
    isolate: str = "auto"
    #: seconds per isolated task; None: auto (:func:`fa4verify.run.engine.task_deadline`); 0: none
    timeout: float | None = None
    opts: tuple[tuple[str, str], ...] = ()
    #: worker processes for isolated checks (resolved: >= 1), fresh per check or persistent
    workers: int = 1
    fresh_workers: bool = False
    #: FA4's persistent kernel cache directory for workers, or None (off)
    kernel_cache: str | None = None
    #: the deployment profile (``--deployment``), as ``(name, json)`` so the config stays hashable
    deployment: tuple[str, str] | None = None
    #: Note [Fake device]: the GPU audited compile-only (``--fake-device``), or None
    fake_device: str | None = None

    @property
    def deployment_dict(self) -> dict[str, Any] | None:
        import json
        return None if self.deployment is None else json.loads(self.deployment[1])

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["deployment"] = self.deployment_dict
        d["archs"] = list(self.archs)
        d["shard"] = None if self.shard is None else f"{self.shard[0]}/{self.shard[1]}"
        d["checks_modules"] = list(self.checks_modules)
        d["opts"] = dict(self.opts)
        return d


def cache_base() -> str:
    """fa4verify's cache directory: ``FA4VERIFY_CACHE_DIR`` or ``.fa4verify-cache``."""
    return os.environ.get("FA4VERIFY_CACHE_DIR", "").strip() or ".fa4verify-cache"


def default_kernel_cache() -> str:
    """``<FA4VERIFY_CACHE_DIR or .fa4verify-cache>/fa4-kernels`` (absolute)."""
    return os.path.abspath(os.path.join(cache_base(), "fa4-kernels"))


def auto_workers(device: str, cpu_count: int | None = None) -> int:
    """Workers for ``--workers auto``: on a GPU, every CPU core but one, at most 15 (FA4's kernel
    compiles are single-threaded CPU work -- a compile's CPU seconds equal its wall seconds,
    measured -- and overlap; the GPU is shared; the core left is the parent's, whose planning
    threads and local checks use ~30 s of a cold audit's 70-90). Measured on the 16-core H200 box
    (main 1f8c92c, one machine, each cold on empty caches): cold default audit 87.6 s with 12
    workers, 71.5 s with 15; warm 13.6 s with 12, 15.4-16.8 s with 15. On the CPU, 2 (at most the
    cores)."""
    n = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(15, n - 1)) if device == "cuda" else max(1, min(2, n))


def build_config(*, dtype: str = "bf16", device: str = "auto", arch: Sequence[str] | str = ("auto",),
                 profile: str = "default", seed: int = 0, keyword: str | None = None,
                 shard: str | None = None, checks_modules: Sequence[str] = (),
                 no_default_checks: bool = False, isolate: str = "auto", timeout: float | str | None = "auto",
                 opts: Sequence[str] = (), cuda: bool | None = None,
                 deployment: str | None = None, workers: str | int = "auto",
                 fresh_workers: bool = False, kernel_cache: str | None = "auto",
                 fake_device: str | None = None) -> AuditConfig:
    """Validate raw option values into an :class:`AuditConfig` (raises :class:`OptionError`).
    ``fake_device``: this process (and its workers) becomes that GPU, compile-only (Note [Fake
    device audit]: :func:`fa4verify.compile.production.enter_fake_device`)."""
    if dtype not in DTYPES:
        raise OptionError(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    if profile not in PROFILE_ORDER:
        raise OptionError(f"--profile {profile!r}: choose from {', '.join(PROFILE_ORDER)}")
    if isolate not in ISOLATE:
        raise OptionError(f"--isolate {isolate!r}: choose from {', '.join(ISOLATE)}")
    try:
        seed = int(seed)
    except (TypeError, ValueError):
        raise OptionError(f"--seed {seed!r}: expected an integer") from None
    if seed < 0:
        raise OptionError(f"--seed {seed}: expected a non-negative integer")
    if timeout is None or str(timeout).strip().lower() == "auto":
        timeout = None
    else:
        try:
            timeout_f = float(timeout)
        except (TypeError, ValueError):
            raise OptionError(f"--timeout {timeout!r}: expected seconds or auto") from None
        if not math.isfinite(timeout_f) or timeout_f < 0:
            raise OptionError(f"--timeout {timeout!r}: expected finite seconds >= 0 (0 = none) or auto")
        timeout = timeout_f
    workers_s = str(workers if workers is not None else "auto").strip().lower()
    if workers_s != "auto":
        try:
            workers_n = int(workers_s)
        except ValueError:
            raise OptionError(f"--workers {workers!r}: expected a positive integer or auto") from None
        if not 1 <= workers_n <= 64:
            raise OptionError(f"--workers {workers!r}: expected 1..64 or auto")
    for opt, vals in (("--deployment", [deployment] if deployment else []),
                      ("--checks-module", list(checks_modules) + list(checks_modules_from_env())),
                      ("--kernel-cache", [kernel_cache] if kernel_cache else [])):
        for v in vals:
            try:
                str(v).encode("utf-8")
            except UnicodeEncodeError:
                # a name that is not UTF-8 cannot be written into the (UTF-8) reports: refused now,
                # not after the whole audit ran
                raise OptionError(f"{opt} {ascii(str(v))[1:-1]}: the path is not valid UTF-8") from None
    cache_s = str(kernel_cache if kernel_cache is not None else "off").strip()
    if not cache_s:
        raise OptionError("--kernel-cache '': expected a directory, auto or off")
    shard_t = parse_shard(shard)
    opts_t = tuple(sorted(parse_opts(opts).items()))
    resolve_archs([a for a in ([arch] if isinstance(arch, str) else list(arch or ()))
                   if a != "auto"], "cpu")  # validate names before the (slow) CUDA probe
    fake = _enter_fake_device(fake_device, device)
    dev = resolve_device(device, cuda=True if fake else cuda)
    archs = resolve_archs(arch, dev)
    if workers_s == "auto":
        workers_n = auto_workers(dev)
    if cache_s.lower() == "off":
        cache_dir = None
    elif cache_s.lower() == "auto":
        cache_dir = default_kernel_cache()
    else:
        cache_dir = os.path.abspath(os.path.expanduser(cache_s))
        if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
            raise OptionError(f"--kernel-cache {kernel_cache!r}: exists and is not a directory")
        try:        # a directory the user named: made now, so a bad one is exit 2, not a worker's crash
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)     # private: it will hold native code
            probe = os.path.join(cache_dir, f".fa4verify-probe-{os.getpid()}")
            open(probe, "wb").close()
            os.unlink(probe)
        except OSError as e:
            raise OptionError(f"--kernel-cache {kernel_cache!r}: cannot use this directory "
                              f"({e.strerror or e})") from None
    cache_dir = _kernel_cache_in_effect(cache_s, cache_dir, create=dev == "cuda")
    mods = tuple(dict.fromkeys(list(checks_modules) + list(checks_modules_from_env())))
    dep = None
    if deployment:
        import json

        from fa4verify.deployment import load as load_deployment
        from fa4verify.errors import DeploymentError
        try:
            d = load_deployment(deployment)
        except DeploymentError as e:
            raise OptionError(str(e)) from None
        if dtype not in d.dtypes:
            raise OptionError(f"--deployment {d.name}: ships {', '.join(d.dtypes)}, not --dtype {dtype}")
        dep = (d.name, json.dumps(d.to_dict(), sort_keys=True))
        # Note [An empty deployment runs nothing]: the audit checks the deployment's archs only,
        # and of those only the ones where its space holds something the installed FA4 supports
        # (Deployment.nothing_supported); none left: every check skips, exit 5 ("nothing ran"),
        # never a pass from the checks that do not read the profile
        archs = tuple(a for a in archs if d.nothing_supported(a, dtype) is None)
    return AuditConfig(dtype=dtype, device=dev, archs=archs, profile=profile, seed=seed,
                       keyword=keyword or None, shard=shard_t, checks_modules=mods,
                       no_default_checks=bool(no_default_checks), isolate=isolate,
                       timeout=timeout, opts=opts_t, deployment=dep, workers=workers_n,
                       fresh_workers=bool(fresh_workers), kernel_cache=cache_dir, fake_device=fake)


def _enter_fake_device(key: str | None, device: str) -> str | None:
    """``--fake-device``: checked, then entered (Note [Fake device audit]); None without it."""
    if key is None or str(key).strip() == "":
        return None
    k = str(key).strip().lower()
    if k not in FAKE_DEVICES:
        raise OptionError(f"--fake-device {key!r}: choose from {', '.join(FAKE_DEVICES)}")
    if device == "cpu":
        raise OptionError("--fake-device audits a GPU (compile-only); it excludes --device cpu")
    import importlib.util
    missing = [d for m, d in (("flash_attn", "flash-attn-4"), ("cutlass", "nvidia-cutlass-dsl"))
               if importlib.util.find_spec(m) is None]
    if missing:
        raise OptionError(f"--fake-device {k}: compiles FA4, but {' / '.join(missing)} is not installed "
                          "(pip install 'fa4verify[fa4]')")
    from fa4verify.compile.production import enter_fake_device
    enter_fake_device(k)
    return k


def _kernel_cache_in_effect(option: str, cache_dir: str | None, *, create: bool = False) -> str | None:
    """The kernel cache the workers will really use, checked (Note [Kernel cache integrity] in
    :mod:`fa4verify.kernels.kernel_cache`).

    ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED`` / ``_DIR`` preset in the environment are FA4's own
    switches and stay in force (a user's setting); the run then names the directory they select
    (``_DIR``, or FA4's default ``/tmp/$USER/...``) -- in the report, and on stderr when it
    replaces a ``--kernel-cache`` given -- instead of the one asked for. That directory, like
    ``--kernel-cache``'s, must be this user's and not group- or world-writable: FA4 links the
    objects in it into the process (refused: exit 2)."""
    from fa4verify.run.pool import KERNEL_CACHE_ENV
    from fa4verify.kernels.kernel_cache import unsafe_reason

    preset = {k: os.environ[k] for k in KERNEL_CACHE_ENV if k in os.environ}
    label = f"--kernel-cache {option!r}"
    if preset:
        if os.environ.get(KERNEL_CACHE_ENV[0], "0") == "1":
            import getpass
            import tempfile
            used = os.path.abspath(os.environ.get(KERNEL_CACHE_ENV[1]) or os.path.join(
                tempfile.gettempdir(), getpass.getuser(), "flash_attention_cute_dsl_cache"))
        else:
            used = None
        if option.lower() != "auto" and used != cache_dir:
            import sys
            print(f"fa4verify: note: {' '.join(f'{k}={v}' for k, v in preset.items())} in the environment "
                  f"replace{'s' if len(preset) == 1 else ''} {label} (FA4 reads them; unset them to use "
                  f"{label}): the kernel cache is {used or 'off'}", file=sys.stderr)
        cache_dir = used
        label = " ".join(f"{k}={v}" for k, v in preset.items())
    if cache_dir is not None and create and not preset and not os.path.lexists(cache_dir):
        try:        # made private now (a umask of 002 would make it group-writable: refused later)
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        except OSError:
            pass    # the pool says what is wrong with it
    if cache_dir is not None:
        why = unsafe_reason(cache_dir)
        if why:
            raise OptionError(f"{label}: kernel cache {cache_dir} is {why}: FA4 would load native code "
                              "from it; use a private directory or --kernel-cache off")
    return cache_dir


# ------------------------------------------------------------------------------------ frontends
def click_options(func: Callable) -> Callable:
    """Decorate a click command with every shared option (``--dtype``, ``--device``, ...)."""
    import click

    for opt in reversed(OPTIONS):
        kw: dict[str, Any] = {"help": opt.help, "show_default": True}
        if opt.flag:
            deco = click.option(f"--{opt.name}", opt.dest, is_flag=True, default=opt.default, **kw)
        else:
            if opt.choices:
                # validated by build_config (one-line error); choices shown in the metavar
                kw["metavar"] = "[" + "|".join(opt.choices) + "]"
            elif opt.type is not None:
                kw["type"] = opt.type
            if opt.metavar and "metavar" not in kw:
                kw["metavar"] = opt.metavar
            if opt.envvar:
                kw["envvar"] = opt.envvar
            deco = click.option(f"--{opt.name}", opt.dest, default=opt.default,
                                multiple=opt.multiple, **kw)
        func = deco(func)
    return func


def add_pytest_options(group: Any) -> None:
    """Add ``--fa4-<name>`` options to a pytest option group (choices validated later, so a bad
    value is a one-line usage error from :func:`build_config`)."""
    for opt in OPTIONS:
        name = f"--fa4-{opt.name}"
        dest = f"fa4_{opt.dest}"
        if opt.flag:
            group.addoption(name, action="store_true", dest=dest, default=opt.default,
                            help=opt.help)
        elif opt.multiple:
            group.addoption(name, action="append", dest=dest, default=None,
                            metavar=opt.metavar or opt.name.upper(),
                            help=f"{opt.help} Default: {opt.default!r}")
        else:
            default = opt.default
            if opt.envvar and os.environ.get(opt.envvar, "").strip():
                default = os.environ[opt.envvar].strip()   # validated by build_config
            group.addoption(name, action="store", dest=dest, default=default,
                            metavar=opt.metavar or (opt.choices and "|".join(opt.choices)) or None,
                            help=f"{opt.help} Default: {opt.default!r}")


def config_from_pytest(config: Any, profile: str) -> AuditConfig:
    """Build the AuditConfig from a pytest ``config`` (``--fa4-*`` values)."""
    vals: dict[str, Any] = {}
    for opt in OPTIONS:
        v = config.getoption(f"fa4_{opt.dest}")
        if opt.multiple and v is None:
            v = opt.default
        vals[opt.dest] = v
    return build_config(dtype=vals["dtype"], device=vals["device"], arch=vals["arch"],
                        profile=profile or vals["profile"], seed=vals["seed"],
                        shard=vals["shard"], checks_modules=vals["checks_modules"],
                        no_default_checks=vals["no_default_checks"], isolate=vals["isolate"],
                        timeout=vals["timeout"], opts=vals["opts"], deployment=vals["deployment"],
                        workers=vals["workers"], fresh_workers=vals["fresh_workers"],
                        kernel_cache=vals["kernel_cache"], fake_device=vals["fake_device"])
