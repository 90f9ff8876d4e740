"""The one exception type the data pipeline raises for input a user can fix."""

from model.errors import UserError


class DataError(UserError):
    """Bad data input (missing path, empty or non-UTF-8 corpus, unreachable hub, ...).

    The message is one readable paragraph that names the thing at fault and the fix;
    train.py prints it and exits with code 2. Raised before any cache is replaced, so an
    existing token cache is never damaged by a failed preparation.
    """
