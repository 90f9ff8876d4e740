"""Hub corpora (tinyshakespeare, wikitext, TinyStories, ...) through `datasets.load_dataset`.

`hub_id` is a hub dataset id or a local folder laid out like a hub dataset repository (a
README.md whose YAML header has a `configs:` block, plus data files); both go through the same
`load_dataset` call. Before touching the network we probe the hub for a few seconds; when it is
unreachable we switch `datasets` to offline mode, so a dataset already in the local HF cache
still loads and anything else fails at once instead of after minutes of retries.
"""

import os
import socket
from contextlib import contextmanager
from urllib.parse import urlparse

from data.documents import Corpus, split_documents
from data.errors import DataError

PROBE_TIMEOUT_S = 3.0


def load_hub(cfg) -> Corpus:
    """Load train and validation splits of `cfg.hub_id` and cut them into documents."""
    import datasets  # imported here: it is slow to import and only hub sources need it

    local = os.path.isdir(cfg.hub_id)
    offline = not local and not hub_reachable()
    try:
        with _offline_mode(offline):
            ds = datasets.load_dataset(cfg.hub_id, cfg.hub_config)
    except Exception as e:   # datasets raises many types (ConnectionError, FileNotFoundError..)
        why = "the hub is unreachable and it is not in the local cache" if offline else str(e)
        raise DataError(
            f"Could not load dataset {cfg.hub_id!r} (config {cfg.hub_config!r}) for "
            f"data={cfg.name}: {' '.join(why.split())[:300]}. To train without the hub, use "
            "data=text with data.train_files=[...] (and data.val_files), or set data.hub_id to a "
            "local folder laid out like a hub dataset (README.md `configs:` block + data files)."
        ) from None
    splits = []
    for split in (cfg.train_split, cfg.val_split):
        if split not in ds:
            raise DataError(f"Dataset {cfg.hub_id!r} has no split {split!r} (it has "
                            f"{sorted(ds)}); set data.train_split / data.val_split.")
        if cfg.text_field not in ds[split].column_names:
            raise DataError(f"Split {split!r} of {cfg.hub_id!r} has no column "
                            f"{cfg.text_field!r} (it has {ds[split].column_names}); set "
                            "data.text_field.")
        splits.append(split_documents(ds[split][cfg.text_field], cfg.document))
    info = {"hub_id": cfg.hub_id, "hub_config": cfg.hub_config, "offline": offline}
    return Corpus(name=cfg.name, document=cfg.document, train=splits[0], val=splits[1],
                  info=info)


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the hub endpoint opens within `timeout` seconds."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextmanager
def _offline_mode(offline: bool):
    """Set the offline switch of `datasets` and `huggingface_hub` for one load, then restore.

    Both libraries read HF_HUB_OFFLINE from the environment once, at import, into module
    constants; those constants are what their download code checks, so that is what we set.
    """
    import datasets
    from huggingface_hub import constants

    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    if offline:
        datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved
