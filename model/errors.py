"""Errors a user can fix by changing their input, and the checks that raise them.

Every entry point (train.py, scripts/) catches `UserError` and prints its message as one
paragraph with a non-zero exit code, instead of a traceback. ConfigError is a bad config value,
DataError bad data input (a missing path, an empty or non-UTF-8 corpus, an unknown hub
revision); both are UserErrors, and ValueErrors for callers that use the library directly.
"""


class UserError(ValueError):
    """Something the user can fix: a bad config value, a missing file, bad data."""


class ConfigError(UserError):
    """A configuration value failed validation; the message names the field and the fix."""


class DataError(UserError):
    """Bad data input. Raised before any cache is replaced, so an existing token cache is
    never damaged by a failed preparation."""


def invalid(key: str, value, fix: str, error: type = ConfigError) -> UserError:
    """The one message shape for a bad value: `key=value is not valid: fix`."""
    return error(f"{key}={value!r} is not valid: {fix}")


def check_positive_int(key: str, value) -> None:
    """ConfigError unless value is an int >= 1 (a bool is not a count)."""
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{key}={value!r} must be a positive integer; set {key} to 1 or more.")


def check_dropout(key: str, value) -> None:
    """ConfigError unless value is a probability in [0, 1) (a bool is not a probability)."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0.0 <= value < 1.0):
        raise ConfigError(f"{key}={value!r} must be in [0, 1); 0.0 turns dropout off.")
