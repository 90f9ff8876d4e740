"""The exception type and the constant that data/ shares with the rest of the repository.

data/ imports nothing from model/ (and model/ nothing from data/): the entry point catches
`DataError` itself, and `IGNORE_INDEX` is PyTorch's own convention, not a model setting.
"""

# Targets with this value are skipped by the loss: it is the default `ignore_index` of
# torch.nn.functional.cross_entropy, the value model/gpt.py passes too (a test holds them equal).
IGNORE_INDEX = -100


class DataError(ValueError):
    """Bad data input (missing path, empty or non-UTF-8 corpus, unknown hub revision, ...).

    The message is one readable paragraph that names the thing at fault and the fix; the
    entry points print it and exit with code 2. Raised before any cache is replaced, so an
    existing token cache is never damaged by a failed preparation.
    """
