"""Errors a user can fix by changing their input, and the checks that raise them. Entry points
print a UserError as one paragraph and exit with code 2; library callers can catch a ValueError."""

import dataclasses
import math


class UserError(ValueError):
    """Something the user can fix: a bad config value, a missing file, bad data."""


class ConfigError(UserError):
    """A configuration value failed validation; the message names the field and the fix."""


class DataError(UserError):
    """Bad data input, raised before any cache is replaced (a failed preparation keeps it)."""


def invalid(key: str, value, fix: str, error: type = ConfigError) -> UserError:
    """The one message shape for a bad value: `key=value is not valid: fix`."""
    return error(f"{key}={value!r} is not valid: {fix}")


def refuse(group: str, checks: tuple) -> None:
    """ConfigError for the first (key, value, ok, fix) of `checks` that is not ok."""
    for key, value, ok, fix in checks:
        if not ok:
            raise invalid(f"{group}.{key}", value, fix)


def is_positive_number(value) -> bool:   # a bool is not a number here
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def check_positive_int(key: str, value) -> None:   # a bool is not a count
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"{key}={value!r} must be a positive integer; set {key} to 1 or more.")


def check_dropout(key: str, value) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
        raise ConfigError(f"{key}={value!r} must be in [0, 1); 0.0 turns dropout off.")


def check_bools(group: str, config) -> None:
    """ConfigError for a field of the dataclass `config` declared bool that holds anything but
    True or False: a switch given as 2, 1 or "yes" is a mistake, not a true."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type in (bool, "bool") and type(value) is not bool:
            raise invalid(f"{group}.{f.name}", value, "use true or false (a switch: a number "
                          "or a word is not read as one).")
