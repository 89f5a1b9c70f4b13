"""Analysis: Polars tables and matplotlib figures from the results store (no torch, no Ray)."""


class AnalysisError(Exception):
    """Nothing to show (unknown study, empty study, unknown kind): the message says what exists."""
