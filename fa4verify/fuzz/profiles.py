"""Hypothesis profiles of the fuzz campaigns (``fa4-ci``, ``fa4-dev``, ``fa4-nightly``) and the
problem-size limits each one draws from."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from hypothesis import HealthCheck, settings

DEFAULT_CACHE_DIR = Path(".fa4verify-cache")

# ============================================================================ profiles
#: Hypothesis profile name -> settings. ``fa4-ci``: derandomized, no deadline (kernels JIT-compile),
#: no database, few examples; ``fa4-dev``: local default, database in the cache directory;
#: ``fa4-nightly``: long runs that let ``hypothesis.target`` steer toward large errors.
PROFILES: dict[str, dict[str, Any]] = {
    "fa4-ci": dict(max_examples=40, derandomize=True, deadline=None, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much]),
    "fa4-dev": dict(max_examples=100, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much]),
    "fa4-nightly": dict(max_examples=5000, deadline=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                               HealthCheck.filter_too_much]),
}

#: Problem size limits per profile (``attention_problems`` arguments). CI keeps shapes small so a
#: twin+oracle example costs well under a second on one core; nightly goes past two KV tiles of
#: every SM90 tile width and up to hd 256.
_LIMITS: dict[str, dict[str, int]] = {
    "fa4-ci": dict(max_seqlen=260, max_batch=2, max_heads=3, max_head_dim=64, max_work=1_500_000),
    "fa4-dev": dict(max_seqlen=300, max_batch=3, max_heads=4, max_head_dim=256, max_work=8_000_000),
    "fa4-nightly": dict(max_seqlen=600, max_batch=4, max_heads=6, max_head_dim=256, max_work=60_000_000),
}


def profile_name(profile: str) -> str:
    """Accept "ci" or "fa4-ci" (etc.); return the registered name."""
    name = profile if profile.startswith("fa4-") else f"fa4-{profile}"
    if name not in PROFILES:
        raise ValueError(f"profile={profile!r}: expected one of {sorted(p[4:] for p in PROFILES)}")
    return name


def profile_limits(profile: str) -> dict[str, int]:
    return dict(_LIMITS[profile_name(profile)])


def register_profiles(database_dir: Optional[os.PathLike] = None) -> None:
    """Register the ``fa4-*`` Hypothesis profiles (idempotent). ``fa4-dev`` and ``fa4-nightly``
    keep their example database under ``database_dir`` (default ``.fa4verify-cache/hypothesis``)."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    db_dir = Path(database_dir) if database_dir is not None else DEFAULT_CACHE_DIR / "hypothesis"
    for name, kw in PROFILES.items():
        kw = dict(kw)
        if name != "fa4-ci":
            kw["database"] = DirectoryBasedExampleDatabase(str(db_dir))
        settings.register_profile(name, **kw)
