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


# The smallest positive sampling temperature: below it the draw follows the rounding of float32
# logits (~1e-6 at logits near 10), and far below it (1e-40) logits / temperature overflow.
MIN_TEMPERATURE = 1e-6


def check_sampling(keys: tuple[str, str, str], tokens, temperature, top_k) -> None:
    """ConfigError unless model/generate.py can sample `tokens` new tokens at `temperature` (0:
    greedy) from the `top_k` likeliest (None: all); `keys` name the three as the caller's user
    sets them (trainer.sample_*, or Sampling's fields, scripts/sample.py's options)."""
    tokens_key, temperature_key, top_k_key = keys
    if not (type(tokens) is int and tokens >= 0):
        raise ConfigError(f"{tokens_key}={tokens!r} must be an integer >= 0, the number of "
                          "tokens to generate.")
    if not (is_positive_number(temperature) or (
            type(temperature) in (int, float) and temperature == 0)):
        raise ConfigError(f"{temperature_key}={temperature!r} must be >= 0 and finite: 0 means "
                          "greedy, e.g. 0.8 samples.")
    if 0 < temperature < MIN_TEMPERATURE:
        raise ConfigError(f"{temperature_key}={temperature!r} is below {MIN_TEMPERATURE:g}, where "
                          "a sample follows the rounding of the logits or overflows them: use 0 "
                          f"(greedy) or a temperature of at least {MIN_TEMPERATURE:g}, e.g. 0.8.")
    if not (top_k is None or (type(top_k) is int and top_k >= 1)):
        raise ConfigError(f"{top_k_key}={top_k!r} must be null or a positive integer: sample "
                          "from the top_k likeliest tokens, or from all (null).")
