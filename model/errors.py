"""Errors a user can fix by changing their input or configuration.

train.py catches `UserError` and prints its message as one paragraph with a
non-zero exit code, instead of a traceback.
"""


class UserError(Exception):
    """Something the user can fix: a bad config value, a missing file, bad data."""


class ConfigError(UserError, ValueError):
    """A configuration value failed validation; the message names the field and the fix."""
