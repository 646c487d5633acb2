"""The README's generated tables (nothing in them is typed by hand).

* :mod:`fa4verify.tables.features` -- FA4's feature x arch claims joined with fa4verify's evidence;
* :mod:`fa4verify.tables.results` -- the results table, from the evidence store
  ``docs/results/evidence.toml``.
"""
