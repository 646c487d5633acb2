"""pytest plugin (entry point ``fa4verify``): run the audit checks as test items.

    pytest --fa4verify                  # profile "default"
    pytest --fa4verify=quick --fa4-dtype bf16 --fa4-only
    pytest --fa4verify -k exp2          # pytest's own -k selects check ids
    pytest --fa4verify -n 8 --fa4-only  # one GPU per xdist worker (fa4verify.run.gpus)

Fast runs (``--fa4-only``, e.g. the one-worker xdist smoke run on a GPU): no test module is
imported (:func:`pytest_ignore_collect`; collecting the test suite only to deselect it costs
seconds per xdist worker), and every item of one pytest process shares one worker pool
(:func:`_session_pool`: one worker process per pytest process instead of one per item, so torch,
the CUDA context and FA4's in-memory compiled kernels are paid once) and FA4's on-disk kernel
cache (``--fa4-kernel-cache``, default ``.fa4verify-cache/fa4-kernels``, shared by the xdist
workers).

One item per check instance (``fa4verify-audit::<check id>``); a skipped check becomes a pytest
skip with its reason, ``fail``/``undecided``/``error`` a test failure whose message is the
check's summary (no traceback).  The ``--fa4-*`` options are the CLI's audit options
(:mod:`fa4verify._options`).  ``--fa4-only`` deselects every other test.  Each item records
``where``, ``status``, ``tightness`` and the metrics in ``user_properties`` (visible in
``--junitxml``); ``--fa4-json F`` / ``--fa4-html F`` write the audit reports of the checks
that ran (not under pytest-xdist workers: use ``fa4verify audit`` for sharded reports).

Importing this module imports nothing heavy (no numpy, torch or flash_attn): it is loaded in
every pytest run of an environment where fa4verify is installed.
"""
from __future__ import annotations

from typing import Any

import pytest

_ENABLED = "fa4verify"


def pytest_addoption(parser: Any) -> None:
    from fa4verify._options import add_pytest_options

    group = parser.getgroup("fa4verify", "fa4verify numerical audit")
    group.addoption("--fa4verify", action="store", nargs="?", const="default", default=None,
                    dest="fa4verify", metavar="PROFILE",
                    help="Run the fa4verify audit checks as test items; PROFILE is quick, "
                         "default, full or exhaustive. Default: not run")
    group.addoption("--fa4-only", action="store_true", dest="fa4_only", default=False,
                    help="With --fa4verify: deselect every test that is not an audit check.")
    group.addoption("--fa4-json", action="store", dest="fa4_json", default=None, metavar="FILE",
                    help="With --fa4verify: write the audit's JSON report (fa4verify.audit/1) of "
                         "the checks that ran. Default: none")
    group.addoption("--fa4-html", action="store", dest="fa4_html", default=None, metavar="FILE",
                    help="With --fa4verify: write the audit's HTML report. Default: none")
    add_pytest_options(group)


#: Markers fa4verify's tests and audit items use, registered here too so that
#: ``pytest --strict-markers --fa4verify`` works from any directory (not only this checkout's
#: pyproject.toml).
MARKERS = (
    "fa4verify_audit: an fa4verify audit check item",
    "gpu: needs a CUDA GPU and flash-attn-4",
    "slow: longer CPU tests (minutes)",
    "fa4: needs the flash-attn-4 package installed (compile-only work runs on the CPU)",
)


def pytest_configure(config: Any) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    profile = config.getoption("fa4verify", default=None)
    if profile is None:
        return
    # under pytest-xdist (-n N) each worker sees one GPU (fa4verify.run.gpus), before any CUDA use
    from fa4verify.run.gpus import pin_worker_gpu
    try:
        pin_worker_gpu()
    except (RuntimeError, ValueError) as e:
        raise pytest.UsageError(str(e)) from None
    from fa4verify._options import config_from_pytest
    from fa4verify.errors import OptionError

    try:
        config.stash[_CONFIG_KEY] = config_from_pytest(config, profile)
    except OptionError as e:
        raise pytest.UsageError(f"fa4verify: {e}") from None
    from fa4verify.audit.atomic import check_outputs
    from fa4verify.errors import OutputPathError

    outs = [(f"--{opt.replace('_', '-')}", config.getoption(opt, default=None))
            for opt in ("fa4_json", "fa4_html")]
    for opt, path in outs:
        if path is not None and config.getoption("numprocesses", default=None):
            raise pytest.UsageError(f"fa4verify: {opt} does not work with "
                                    "pytest-xdist (-n); use fa4verify audit --shard I/N and "
                                    "fa4verify report merge")
    try:
        check_outputs(outs)
    except OutputPathError as e:
        raise pytest.UsageError(f"fa4verify: {e}") from None
    config.stash[_RECORDS_KEY] = []


_CONFIG_KEY: "pytest.StashKey[Any]" = pytest.StashKey()
_RECORDS_KEY: "pytest.StashKey[list[Any]]" = pytest.StashKey()
_POOL_KEY: "pytest.StashKey[Any]" = pytest.StashKey()


def pytest_ignore_collect(collection_path: Any, config: Any) -> bool | None:
    """With ``--fa4verify --fa4-only`` nothing but the audit items runs: import no test module."""
    if _CONFIG_KEY in config.stash and config.getoption("fa4_only", default=False):
        return True
    return None


def _session_pool(config: Any, audit_config: Any) -> Any:
    """This pytest process's worker pool for isolated checks (created on first use, closed at
    ``pytest_unconfigure``)."""
    pool = config.stash.get(_POOL_KEY, None)
    if pool is None:
        from fa4verify.run.pool import WorkerPool
        pool = WorkerPool(audit_config.workers, timeout=audit_config.timeout,
                          fresh=audit_config.fresh_workers, kernel_cache=audit_config.kernel_cache)
        config.stash[_POOL_KEY] = pool
    return pool


def pytest_unconfigure(config: Any) -> None:
    pool = config.stash.get(_POOL_KEY, None)
    if pool is not None:
        del config.stash[_POOL_KEY]
        pool.close()


class AuditCheckFailure(Exception):
    """A check that failed, errored or could not decide (message = its summary)."""


class AuditCollector(pytest.Collector):
    """Holds the audit items (one per check instance)."""

    def __init__(self, *, selected: list[Any], audit_config: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self._selected = selected
        self._audit_config = audit_config

    def collect(self) -> list[Any]:
        import pathlib
        import sys

        items = []
        for s in self._selected:
            f = getattr(sys.modules.get(s.spec.module), "__file__", None)
            kw = {"path": pathlib.Path(f)} if f else {}
            items.append(AuditItem.from_parent(self, name=s.id, sel=s,
                                               audit_config=self._audit_config, **kw))
        return items


class AuditItem(pytest.Item):
    """One audit check instance."""

    def __init__(self, *, sel: Any, audit_config: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.sel = sel
        self.audit_config = audit_config
        self.add_marker("fa4verify_audit")
        if "cuda" in sel.spec.needs:
            self.add_marker("gpu")

    def runtest(self) -> None:
        from fa4verify.audit.runner import run_audit

        run = run_audit(self.audit_config, selected=[self.sel], specs=[self.sel.spec],
                        pool=_session_pool(self.config, self.audit_config))
        rec = run.records[0]
        self.config.stash.get(_RECORDS_KEY, []).append(rec)
        r = rec.result
        self.user_properties.append(("fa4verify.status", r.status))
        self.user_properties.append(("fa4verify.where", r.where or "-"))
        self.user_properties.append(("fa4verify.duration_s", f"{rec.duration_s:.3f}"))
        if r.tightness is not None:
            self.user_properties.append(("fa4verify.tightness", r.tightness))
        for k, v in r.metrics.items():
            self.user_properties.append((f"fa4verify.metric.{k}", v))
        if r.status == "skip":
            try:  # report the skip at the item, not at this line (pytest >= 7)
                raise pytest.skip.Exception(r.summary or "skipped", _use_item_location=True)
            except TypeError:  # pragma: no cover - older pytest
                pytest.skip(r.summary or "skipped")
        if r.status != "pass":
            raise AuditCheckFailure(f"{rec.id}: {r.status.upper()} ({r.where or 'no result'}): "
                                    f"{r.summary}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, AuditCheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int, str]:
        return self.path, 0, f"fa4verify audit check {self.name}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    if _CONFIG_KEY not in config.stash:
        return
    from fa4verify.audit.runner import load_specs, select

    audit_config = config.stash[_CONFIG_KEY]
    selected = select(load_specs(audit_config), audit_config)
    coll = AuditCollector.from_parent(session, name="fa4verify-audit", selected=selected,
                                      audit_config=audit_config)
    new = list(coll.collect())
    if config.getoption("fa4_only", default=False):
        if items:
            config.hook.pytest_deselected(items=list(items))
        items[:] = new
    else:
        items.extend(new)


def _nothing_ran(session: Any) -> None:
    """Note [Nothing ran is not a pass]: audit items that all skipped (no check passed or
    failed) are exit 5, as ``fa4verify audit`` says -- a gate that checked nothing must not pass."""
    config = session.config
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    out: dict[str, int] = {}          # the terminal's reports: the xdist controller's included
    for key in ("passed", "failed", "skipped"):
        for r in tr.stats.get(key, []):
            if "fa4verify-audit::" in getattr(r, "nodeid", "") and getattr(r, "when", None) in ("setup", "call"):
                out[key] = out.get(key, 0) + 1
    if sum(out.values()) and not out.get("passed") and not out.get("failed") \
            and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        msg = (f"fa4verify: nothing ran: all {sum(out.values())} selected audit check(s) skipped "
               "(exit 5, as fa4verify audit)")
        tr.ensure_newline()
        tr.write_line(msg, red=True)


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    """Write ``--fa4-json`` / ``--fa4-html`` from the checks this process ran (atomically); an
    audit whose every item skipped fails the session (Note [Nothing ran is not a pass])."""
    config = session.config
    if _CONFIG_KEY in config.stash and not hasattr(config, "workerinput"):
        _nothing_ran(session)
    if _CONFIG_KEY not in config.stash:
        return
    jpath, hpath = config.getoption("fa4_json", None), config.getoption("fa4_html", None)
    if (jpath is None and hpath is None) or hasattr(config, "workerinput"):  # xdist workers write nothing
        return
    from fa4verify.audit import environment
    from fa4verify.audit.report_json import build_report
    from fa4verify.audit.runner import exit_code_for
    from fa4verify.audit.report_files import write_reports

    audit_config = config.stash[_CONFIG_KEY]
    records = sorted(config.stash.get(_RECORDS_KEY, []), key=lambda r: r.id)
    report = build_report(config=audit_config.to_dict(),
                          environment=environment.collect(audit_config.device),
                          results=[r.to_dict() for r in records], exit_code=exit_code_for(records),
                          duration_s=sum(r.duration_s for r in records),
                          command=["pytest", *config.invocation_params.args])
    write_reports(report, json_path=jpath, html_path=hpath)
