"""Count-based reference levels: unigram, bigram and trigram cross-entropy of a validation split;
a model that beats none of these has learnt nothing a table of counts knows. For order n,
P(c | ctx) = (count(ctx c) + k) / (count(ctx) + k V), add-k (Lidstone) smoothed, V the vocabulary
size; k is chosen per order from K_GRID on the last HELD_OUT share of the *training* split
(counted on the rest), the counts refitted on the whole training split, and the validation split
scored once: validation chooses nothing. Each split is one stream as the token cache stores it
(every document followed by EOT), preceded by n-1 EOT tokens. Counts are sparse: an n-gram is
packed into one int64, ((t1 V + t2) V + ...) V + tn, counted chunk by chunk with numpy.unique and
merged into sorted arrays; at most `max_train_tokens` training tokens are counted. The result is
cached as baselines.json in the corpus's token cache folder; `reference_levels` reads it.
"""

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


def windows(tokens, span: tuple[int, int], eot: int, chunk: int):
    """tokens[start:stop] in chunks, each after the 2 tokens before it (EOT at the start)."""
    for lo in range(span[0], span[1], chunk):
        hi = min(lo + chunk, span[1])
        before = np.asarray(tokens[max(0, lo - 2):lo]).astype(np.int64)
        pad = np.full(2 - len(before), eot, np.int64)
        yield np.concatenate([pad, before, np.asarray(tokens[lo:hi]).astype(np.int64)])


def count(tables: dict, V: int, streams) -> None:
    """Adds the n-grams ending in each stream of `windows` to {n: (keys, counts)}."""
    for stream in streams:
        for n, table in tables.items():
            tables[n] = merge(*table, *np.unique(packed(stream[3 - n:], n, V),
                                                 return_counts=True))


def contexts(keys: np.ndarray, counts: np.ndarray, n: int, V: int) -> tuple:
    """count(ctx): the number of n-grams that start with each context, as sorted arrays."""
    ctx = keys // V if n > 1 else np.zeros_like(keys)  # sorted, as the keys are
    first = np.flatnonzero(np.r_[True, ctx[1:] != ctx[:-1]]) if len(ctx) else ctx
    return (ctx[first], np.add.reduceat(counts, first)) if len(ctx) else (ctx, ctx)


def scored(tables: dict, V: int, streams):
    """Per stream of `windows`, {n: each target's (count(ctx c), count(ctx))}."""
    ctx = {n: contexts(*table, n, V) for n, table in tables.items()}
    for stream in streams:
        keys = {n: packed(stream[3 - n:], n, V) for n in tables}
        yield {n: (lookup(*tables[n], k), lookup(*ctx[n], k // V if n > 1 else np.zeros_like(k)))
               for n, k in keys.items()}


def add_k_loss(c: np.ndarray, m: np.ndarray, k: float, V: int, weights=None) -> float:
    """The summed -ln P of targets with n-gram counts c and context counts m, add-k smoothed."""
    nll = np.log(m + k * V) - np.log(c + k)
    return float(nll.sum() if weights is None else (nll * weights).sum())


def choose_ks(tables: dict, V: int, streams, base: int, grid) -> dict:
    """Per order, the k of `grid` best on the held-out streams, by (c, m) histogram; base: more
    than any count, so that a pair (c, m) packs as c * base + m."""
    hist = {n: (np.zeros(0, np.int64),) * 2 for n in tables}
    for counts in scored(tables, V, streams):
        for n, (c, m) in counts.items():
            hist[n] = merge(*hist[n], *np.unique(c * base + m, return_counts=True))
    return {n: grid[int(np.argmin([add_k_loss(keys // base, keys % base, k, V, weights)
                                   for k in grid]))] for n, (keys, weights) in hist.items()}


def compute(data: PreparedData, settings: Settings = DEFAULT, chunk: int = CHUNK) -> dict:
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
    tables = {n: (np.zeros(0, np.int64),) * 2 for n in ORDERS}
    count(tables, V, windows(train, (0, cut), eot, chunk))
    held_out = windows(train, (cut, counted), eot, chunk)
    ks = choose_ks(tables, V, held_out, counted + 1, settings.k_grid)
    count(tables, V, windows(train, (cut, counted), eot, chunk))  # all `counted` tokens now
    total = dict.fromkeys(ORDERS, 0.0)
    for counts in scored(tables, V, windows(val, (0, len(val)), eot, chunk)):
        for n, (c, m) in counts.items():
            total[n] += add_k_loss(c, m, ks[n], V)
    nats = {ORDERS[n]: total[n] / len(val) for n in ORDERS}
    bpt = data.meta["bytes_per_token"]["val"]
    return {"nats_per_token": nats,
            "bits_per_byte": {name: bits_per_byte(v, bpt) for name, v in nats.items()},
            "smoothing": "add-k", "k": {ORDERS[n]: ks[n] for n in ORDERS},
            "held_out_tokens": counted - cut, "train_tokens_counted": counted,
            "train_tokens": len(train), "capped": counted < len(train),
            "val_tokens": len(val), "vocab_size": V, "bytes_per_token": bpt,
            "distinct": {ORDERS[n]: len(keys) for n, (keys, _) in tables.items()},
            "seconds": time.perf_counter() - start, "settings": asdict(settings)}


def cached(data: PreparedData, settings: Settings | None = None, chunk: int = CHUNK
           ) -> tuple[dict, bool]:
    """baselines.json and whether it was cached (made unless cached with `settings`)."""
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
    """{"unigram", "bigram", "trigram"}: nats per token of the corpus's val split."""
    data = prepare(data_config(run_dir_or_data_cfg), progress=False)
    return dict(cached(data)[0]["nats_per_token"])


NO_LEVELS_RECALL = ("no reference levels: data=recall generates its sequences (no corpus, no"
                    " n-gram counts), so a run fails only by a non-finite loss or a final loss"
                    " above its step-0 loss")


def levels_of_runs(run_dirs: list[Path]) -> tuple[dict[str, float] | None, str]:
    """The reference levels shared by the runs, or None and why not."""
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
    except (UserError, OSError) as e:   # the command that makes them, with the run's data overrides
        path = run_dir / ".hydra" / "overrides.yaml"
        items = map(str, (yaml.safe_load(path.read_text()) or []) if path.is_file() else [])
        command = " ".join(["python scripts/baselines.py",
                            *(item for item in items if item.lstrip("+").startswith("data"))])
        return None, f"no reference levels ({e}); `{command}` computes them"


def levels_line(levels: dict[str, float]) -> str:
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
