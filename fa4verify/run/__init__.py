"""The execution engine: plan, run in isolated workers, merge (Note [One engine], :mod:`.engine`)."""
