"""Private implementations behind fa4verify.strategies."""
