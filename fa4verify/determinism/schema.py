"""The vocabulary of the determinism records: schema names, tensor names and statuses."""
from __future__ import annotations



SCHEMA_MANIFEST = "fa4verify.determinism.manifest/1"
SCHEMA_REPORT = "fa4verify.determinism.report/1"
SCHEMA_WORKER = "fa4verify.determinism.worker/1"

TENSORS = ("dq", "dk", "dv", "dsink")
GUARDED = ("dq", "dk", "dv")
STATUSES = ("reproducible", "not-reproducible", "guard-violation", "unwritten", "unsupported",
            "xfail", "xpass", "error", "not-run")
#: statuses that make ``fa4verify determinism`` exit 1
FAILING = frozenset({"not-reproducible", "guard-violation", "unwritten", "error"})
UNSUPPORTED_MSG = "not supported by FA4 for this configuration"
