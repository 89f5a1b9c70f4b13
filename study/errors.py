"""Errors of a run that are not bad input (those are study.config.ConfigError): each is one `loopstudy: ...` line."""


class TrainingError(RuntimeError):
    """Training cannot go on (the loss became NaN or infinite): the trial fails with this reason and stores no
    results, rather than storing a NaN loss as if it were a result."""
