"""Audit runner, check registry, reports, baselines (see fa4verify.audit.registry)."""
