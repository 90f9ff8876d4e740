"""Count-based reference levels: unigram, bigram and trigram cross-entropy of a validation split.

A model that beats none of these has learnt nothing a table of counts knows. For order n,
P(c | ctx) = (count(ctx c) + k) / (count(ctx) + k V), add-k (Lidstone) smoothed, V the vocabulary
size; k is chosen per order from K_GRID on the last HELD_OUT share of the *training* split
(counted on the rest), the counts refitted on the whole training split, and the validation split
scored once: validation chooses nothing. Each split is one stream as the token cache stores it
(every document followed by EOT), preceded by n-1 EOT tokens. Counts are sparse: an n-gram is
packed into one int64, ((t1 V + t2) V + ...) V + tn, counted chunk by chunk with numpy.unique and
merged into sorted arrays; at most `max_train_tokens` training tokens are counted. The result is
cached as baselines.json in the corpus's token cache folder; `reference_levels` reads it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

from data.config import DataConfig
from data.prepare import PreparedData, bits_per_byte, prepare
from model.errors import DataError, UserError
from trainer.files import write_json

ORDERS = {1: "unigram", 2: "bigram", 3: "trigram"}
K_GRID = tuple(float(k) for k in np.logspace(-4, 1, 26))  # add-k candidates, 10^-4 .. 10
HELD_OUT = 0.1  # share of the training tokens (the tail) that chooses k
CHUNK = 1 << 22  # tokens per counting chunk
MAX_TRAIN_TOKENS = 50_000_000  # trigram tables of ~this many BPE tokens fit in a few GB
FORMAT = 1  # of baselines.json; a file of another format or other settings is recomputed
FILE = "baselines.json"


@dataclass(frozen=True)
class Settings:
    """What a baselines.json was computed with; a cached file with other settings is stale."""

    format: int = FORMAT
    k_grid: tuple = K_GRID
    held_out: float = HELD_OUT
    max_train_tokens: int = MAX_TRAIN_TOKENS


DEFAULT = Settings()


class Counts:
    """Sparse n-gram counts of one order: sorted packed keys and their counts."""

    def __init__(self, n: int, V: int):
        self.n, self.V = n, V
        self.keys = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self._contexts = None  # contexts(), computed once per state of the table

    def add(self, keys: np.ndarray) -> None:
        """Merge the n-grams `keys` (packed) into the table."""
        self.keys, self.counts = merge(self.keys, self.counts, *np.unique(keys, return_counts=True))
        self._contexts = None

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The counts of packed n-grams `keys` (0 for unseen ones)."""
        return lookup(self.keys, self.counts, keys)

    def contexts(self) -> tuple[np.ndarray, np.ndarray]:
        """count(ctx): the number of n-grams that start with each context, as sorted arrays."""
        if self._contexts is None:
            ctx = self.keys // self.V if self.n > 1 else np.zeros_like(self.keys)  # sorted
            first = np.flatnonzero(np.r_[True, ctx[1:] != ctx[:-1]]) if len(ctx) else ctx
            sums = np.add.reduceat(self.counts, first) if len(ctx) else ctx
            self._contexts = (ctx[first], sums)
        return self._contexts


def merge(keys, counts, new_keys, new_counts) -> tuple[np.ndarray, np.ndarray]:
    """Two sparse count tables (sorted unique keys, counts) as one."""
    if not len(keys):
        return new_keys.astype(np.int64), new_counts.astype(np.int64)
    both, inverse = np.unique(np.concatenate([keys, new_keys]), return_inverse=True)
    summed = np.bincount(inverse, weights=np.concatenate([counts, new_counts]).astype(np.float64))
    return both, summed.round().astype(np.int64)


def lookup(keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
    """counts[keys == q] for each q of `query`, 0 where q is not in the sorted `keys`."""
    if not len(keys):
        return np.zeros(len(query), np.int64)
    at = np.searchsorted(keys, query).clip(max=len(keys) - 1)
    return np.where(keys[at] == query, counts[at], 0)


def packed(stream: np.ndarray, n: int, V: int) -> np.ndarray:
    """The n-grams of `stream` ending at positions n-1 .. len-1, each packed into an int64."""
    key = np.zeros(len(stream) - n + 1, np.int64)
    for i in range(n):
        key = key * V + stream[i:len(stream) - n + 1 + i].astype(np.int64)
    return key


def windows(tokens, start: int, stop: int, eot: int, chunk: int):
    """tokens[start:stop] in chunks, each preceded by the 2 tokens before it (EOT before the
    stream's start): a chunk's n-grams are those ending inside it, for every order <= 3."""
    for lo in range(start, stop, chunk):
        hi = min(lo + chunk, stop)
        before = np.asarray(tokens[max(0, lo - 2):lo]).astype(np.int64)
        pad = np.full(2 - len(before), eot, np.int64)
        yield np.concatenate([pad, before, np.asarray(tokens[lo:hi]).astype(np.int64)])


def count(tables: dict[int, Counts], tokens, start: int, stop: int, eot: int, chunk: int):
    """Add the n-grams whose last token is in tokens[start:stop] to every table."""
    for stream in windows(tokens, start, stop, eot, chunk):
        for n, table in tables.items():
            table.add(packed(stream[3 - n:], n, table.V))


def target_counts(table: Counts, stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each target of a window (`windows`): count(ctx c) and count(ctx)."""
    keys = packed(stream[3 - table.n:], table.n, table.V)
    ctx_keys, ctx_counts = table.contexts()
    ctx = keys // table.V if table.n > 1 else np.zeros_like(keys)
    return table.lookup(keys), lookup(ctx_keys, ctx_counts, ctx)


def held_out_histogram(tables: dict[int, Counts], tokens, start: int, stop: int, eot: int,
                       chunk: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per order, the targets tokens[start:stop] as a histogram of (count(ctx c), count(ctx))
    pairs: the loss of every k of the grid is then a weighted sum over a few distinct pairs."""
    base = stop + 1  # a pair (c, m), both <= stop, packed as c * base + m
    hist = {n: (np.zeros(0, np.int64), np.zeros(0, np.int64)) for n in tables}
    for stream in windows(tokens, start, stop, eot, chunk):
        for n, table in tables.items():
            c, m = target_counts(table, stream)
            hist[n] = merge(*hist[n], *np.unique(c * base + m, return_counts=True))
    return {n: (keys // base, keys % base, weights) for n, (keys, weights) in hist.items()}


def add_k_loss(c: np.ndarray, m: np.ndarray, k: float, V: int, weights=None) -> float:
    """The summed -ln P of targets with n-gram counts c and context counts m, add-k smoothed."""
    nll = np.log(m + k * V) - np.log(c + k)
    return float(nll.sum() if weights is None else (nll * weights).sum())


def choose_k(c: np.ndarray, m: np.ndarray, weights: np.ndarray, V: int, grid) -> float:
    """The k of `grid` with the lowest held-out loss (the smallest such k on a tie)."""
    losses = [add_k_loss(c, m, k, V, weights) for k in grid]
    return grid[int(np.argmin(losses))]


def compute(data: PreparedData, settings: Settings = DEFAULT, chunk: int = CHUNK) -> dict:
    """The reference levels of `data` (module docstring): baselines.json's content."""
    V, eot, train, val = data.vocab_size, data.eot_id, data.train, data.val
    if V ** 3 >= 2 ** 63:
        raise DataError(f"A vocabulary of {V:,} ids is too large to pack a trigram into an "
                        "int64; the n-gram reference levels need a vocabulary below 2,097,152.")
    counted = min(len(train), settings.max_train_tokens)
    cut = counted - int(round(settings.held_out * counted))
    if cut < 1 or cut >= counted or len(val) < 1:
        raise DataError(f"The n-gram reference levels need at least a few training tokens and "
                        f"one validation token; this corpus has {len(train)} training and "
                        f"{len(val)} validation tokens. Add text to data.train_files/val_files.")
    start = time.perf_counter()
    tables = {n: Counts(n, V) for n in ORDERS}
    count(tables, train, 0, cut, eot, chunk)
    hist = held_out_histogram(tables, train, cut, counted, eot, chunk)
    ks = {n: choose_k(*hist[n], V, settings.k_grid) for n in ORDERS}
    count(tables, train, cut, counted, eot, chunk)  # now the counts of all `counted` tokens
    total = dict.fromkeys(ORDERS, 0.0)
    for stream in windows(val, 0, len(val), eot, chunk):
        for n, table in tables.items():
            total[n] += add_k_loss(*target_counts(table, stream), ks[n], V)
    nats = {ORDERS[n]: total[n] / len(val) for n in ORDERS}
    bpt = data.meta["bytes_per_token"]["val"]
    return {"nats_per_token": nats,
            "bits_per_byte": {name: bits_per_byte(v, bpt) for name, v in nats.items()},
            "smoothing": "add-k", "k": {ORDERS[n]: ks[n] for n in ORDERS},
            "held_out_tokens": counted - cut, "train_tokens_counted": counted,
            "train_tokens": len(train), "capped": counted < len(train),
            "val_tokens": len(val), "vocab_size": V, "bytes_per_token": bpt,
            "distinct": {ORDERS[n]: len(t.keys) for n, t in tables.items()},
            "seconds": time.perf_counter() - start, "settings": asdict(settings)}


def cached(data: PreparedData, settings: Settings | None = None, chunk: int = CHUNK
           ) -> tuple[dict, bool]:
    """baselines.json of the token cache folder of `data`, and whether it was read from the
    file. Computed (with `settings`, or the defaults) and written when it is missing, of
    another format, or made with settings other than those asked for; settings=None takes
    whatever settings the cached file was made with (e.g. a cap chosen on the command line)."""
    path = data.folder / FILE
    if path.is_file():
        result = json.loads(path.read_text())
        made_with = result.get("settings", {})
        wanted = None if settings is None else json.loads(json.dumps(asdict(settings)))
        if made_with.get("format") == FORMAT and wanted in (None, made_with):
            return result, True
    result = compute(data, settings or DEFAULT, chunk)
    write_json(path, result)
    return result, False


def data_config(run_dir_or_data_cfg: str | Path | DataConfig) -> DataConfig:
    """A DataConfig as given, or the data config of a run folder (its .hydra/config.yaml)."""
    if isinstance(run_dir_or_data_cfg, DataConfig):
        return run_dir_or_data_cfg
    path = Path(run_dir_or_data_cfg) / ".hydra" / "config.yaml"
    if not path.is_file():
        raise DataError(f"{path} does not exist: reference levels need a run folder written by "
                        "train.py (its .hydra/config.yaml names the data) or a DataConfig.")
    return DataConfig(**yaml.safe_load(path.read_text())["data"])


def reference_levels(run_dir_or_data_cfg: str | Path | DataConfig) -> dict[str, float]:
    """{"unigram", "bigram", "trigram"}: nats per token of the validation split, for a run
    folder or a data config; from the corpus's cached baselines.json, computed (and cached)
    if missing, which prepares the token cache too if needed."""
    data = prepare(data_config(run_dir_or_data_cfg), progress=False)
    return dict(cached(data)[0]["nats_per_token"])


def data_overrides(run_dir: Path) -> list[str]:
    """The data overrides of a run folder (.hydra/overrides.yaml), for a command line."""
    path = run_dir / ".hydra" / "overrides.yaml"
    items = (yaml.safe_load(path.read_text()) or []) if path.is_file() else []
    return [str(item) for item in items if str(item).lstrip("+").startswith("data")]


NO_LEVELS_RECALL = ("no reference levels: data=recall generates its sequences (no corpus, no"
                    " n-gram counts), so a run fails only by a non-finite loss or a final loss"
                    " above its step-0 loss")


def levels_of_runs(run_dirs: list[Path]) -> tuple[dict[str, float] | None, str]:
    """The reference levels shared by the runs, or None and why not (no data config, several
    data configs, generated data (data=recall), or the cache could not be made: then the
    command that makes it)."""
    configs = {}
    for run_dir in run_dirs:
        if (run_dir / ".hydra" / "config.yaml").is_file():
            cfg = data_config(run_dir)
            configs.setdefault(json.dumps(asdict(cfg), sort_keys=True), (cfg, run_dir))
    if not configs:
        return None, "no reference levels: the run folders have no .hydra/config.yaml"
    if len(configs) > 1:
        return None, (f"no reference levels: the runs use {len(configs)} data configs; report"
                      " on the runs of one corpus at a time")
    cfg, run_dir = next(iter(configs.values()))
    if cfg.source == "recall":
        return None, NO_LEVELS_RECALL
    try:
        return reference_levels(cfg), ""
    except (UserError, OSError) as e:
        command = " ".join(["python scripts/baselines.py", *data_overrides(run_dir)])
        return None, f"no reference levels ({e}); `{command}` computes them"


def levels_line(levels: dict[str, float]) -> str:
    """The sentence results.md prints above each table."""
    listed = ", ".join(f"{name} {value:.4f}" for name, value in levels.items())
    return (f"Reference levels (nats/token on the whole validation split; add-k n-gram counts"
            f" of the training split, `python scripts/baselines.py`): {listed}.")


def above_every_table(markdown: str, line: str) -> str:
    """`line` and a blank line inserted above the first row of every table of `markdown`."""
    out, previous = [], ""
    for row in markdown.split("\n"):
        if row.startswith("|") and not previous.startswith("|"):
            out += [line, ""]
        out.append(row)
        previous = row
    return "\n".join(out)
