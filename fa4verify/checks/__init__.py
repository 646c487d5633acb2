"""Audit checks. Every module in this package is imported by the audit runner
(``fa4verify.audit.registry.discover``) and registers its checks with ``@check``.
One module per area; each module is owned by the area's engineer."""
