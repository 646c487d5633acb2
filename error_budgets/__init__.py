"""fa4verify.error_budgets — tolerances as reviewed data (TOML) plus the loader."""
