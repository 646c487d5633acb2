"""The MUFU ``ex2.approx`` statistics recorded on a GPU (``kernels/evidence/golden/mufu_stats.json``).

The MUFU path cannot be modelled on a CPU, so its figures are read from a file measured on a GPU
(``benchmarks`` / ``scripts`` write it) and labelled ``recorded on <GPU> (sm_XY)``. The audit
check ``exp2.mufu`` judges them and ``fa4verify exp2`` reports them; both read them here, so a
check never imports the CLI.
"""
from __future__ import annotations

import json

from fa4verify.kernels.evidence import evidence_path

#: Where the recorded statistics live (package data, so a wheel install reads them too).
MUFU_STATS = evidence_path("golden/mufu_stats.json")


def mufu_section() -> dict:
    """The recorded statistics as a JSON-able dict: ``{"status": "recorded", "source", "stats"}``,
    ``{"status": "unreadable: <why>", "source"}`` or ``{"status": "not measured here", "note"}``.
    Never raises."""
    if MUFU_STATS.is_file():
        try:
            return {"status": "recorded", "source": str(MUFU_STATS),
                    "stats": json.loads(MUFU_STATS.read_text())}
        except (OSError, json.JSONDecodeError) as e:
            return {"status": f"unreadable: {e}", "source": str(MUFU_STATS)}
    return {"status": "not measured here",
            "note": "the MUFU ex2.approx path cannot be modelled on a CPU; "
                    f"no GPU-recorded statistics at {MUFU_STATS}"}


def mufu_where(m: dict) -> str:
    """``recorded on <GPU> (sm_XY)`` of a :func:`mufu_section` (from its provenance), else
    ``recorded on a GPU``."""
    from fa4verify.audit.evidence import recording_from_versions
    st = m.get("stats") if isinstance(m.get("stats"), dict) else {}
    try:
        return recording_from_versions("mufu_stats.json", (st.get("provenance") or {}).get("versions")).where
    except ValueError:
        return "recorded on a GPU"
