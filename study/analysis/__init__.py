"""Analysis: Polars tables and matplotlib figures from the results store (no torch, no Ray)."""
