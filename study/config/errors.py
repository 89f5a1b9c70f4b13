"""The one error type for configuration problems."""


class ConfigError(ValueError):
    """A configuration problem, with the file and key in the message."""
