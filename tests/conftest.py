"""What this machine has, decided once for the whole suite, and the skips that follow from it.

Markers (registered in pyproject's ``[tool.pytest.ini_options] markers``; ``--strict-markers``):

``gpu``
    needs a CUDA device and an importable flash-attn-4. Skipped, with the reason
    :func:`fa4verify.kernels.adapter.cuda_status` gives ("no CUDA device: torch.cuda.is_available()
    is False (torch 2.13.0+cpu is a CPU build)"), on a machine without them. Run them on the lent
    H200 with ``python -m pytest -m gpu tests``.
``fa4``
    needs the flash-attn-4 and nvidia-cutlass-dsl packages installed (compile-only work, source
    reading: runs on a CPU). Skipped with the reason when either is missing. A test marked ``gpu``
    needs FA4 too, through ``cuda_status``.
``slow``
    a CPU test that takes long (about 10 s or more on an idle 2-core machine: FA4 compiles,
    Hypothesis find-and-shrink runs, fresh processes, the wheel build). The fast tier is
    ``python -m pytest -q -n 2 -m "not slow" tests`` (at most 3 minutes on 2 cores); the README's
    test command, ``python -m pytest -q -n 2 tests``, runs every tier, and CI (``.ci/run``) runs it.
``slow(extended="what")``
    an extended run beyond what CI runs (full FA4 compile matrices, the exhaustive exp2 sweep):
    skipped unless ``FA4VERIFY_SLOW=1``, with the reason naming what it would run.

Fixture ``no_cuda``: skips a test of the behaviour without a GPU ("no GPU is a usage error") on
a machine where the ``gpu`` tests run.

Each decision is made once per process (xdist worker), after collection and ``-m`` / ``-k``
deselection, and only when a selected test carries the marker: torch (and, on a CUDA machine,
FA4) is imported only then. A failure to import fa4verify's own modules is an
error, never a skip.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import pytest

#: Packages the ``fa4`` marker needs: import name -> distribution (what ``pip install`` takes).
FA4_PACKAGES = {"flash_attn": "flash-attn-4", "cutlass": "nvidia-cutlass-dsl"}


@functools.lru_cache(maxsize=None)
def gpu_status() -> tuple[bool, str]:
    """``(True, "<gpu>, sm_XY")`` when a CUDA device and flash_attn.cute are usable, else
    ``(False, "no CUDA device: <why>")`` (the adapter's own test, one for the whole project)."""
    from fa4verify.kernels import adapter
    ok, why = adapter.cuda_status()
    return ok, (why if ok else f"no CUDA device: {why}")


@functools.lru_cache(maxsize=None)
def fa4_status() -> tuple[bool, str]:
    """``(True, "")`` when flash-attn-4 and the CuTe DSL are installed, else ``(False, reason)``.
    Only looks the packages up (no import: importing FA4 costs seconds, and the tests that need its
    modules import them and fail if the installed FA4 is broken)."""
    missing = [dist for mod, dist in FA4_PACKAGES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        return False, f"{' / '.join(missing)} not installed (pip install 'fa4verify[fa4]')"
    return True, ""


def extended_enabled() -> bool:
    """``FA4VERIFY_SLOW=1``: run the ``slow(extended=...)`` tests too."""
    return os.environ.get("FA4VERIFY_SLOW") == "1"


def skip_reason(item) -> str | None:
    """Why ``item`` cannot run here, or None (in the order fa4 -> gpu -> extended)."""
    if item.get_closest_marker("fa4") is not None:
        ok, why = fa4_status()
        if not ok:
            return why
    if item.get_closest_marker("gpu") is not None:
        ok, why = gpu_status()
        if not ok:
            return why
    slow = item.get_closest_marker("slow")
    if slow is not None and "extended" in slow.kwargs and not extended_enabled():
        return f"extended run: set FA4VERIFY_SLOW=1 for {slow.kwargs['extended']}"
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """After ``-m`` / ``-k`` deselection: a skip marker with the reason on each test that cannot
    run here (so ``-rs`` names the test's own file and line)."""
    for item in items:
        why = skip_reason(item)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def no_cuda():
    """For tests of what happens without a usable GPU (the adapter raises ``NoCudaError``, a
    command exits 2 with "no CUDA device"): skipped where :func:`gpu_status` is ok."""
    ok, where = gpu_status()
    if ok:
        pytest.skip(f"a CUDA device is present ({where}): this test is about a machine without one")
