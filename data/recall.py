"""Synthetic recall tasks (`data=recall`): sequences a model can only answer by attending.

Three generators, chosen by `data.task`; each gives (inputs, targets) of shape (n, data.seq_len)
with targets IGNORE_INDEX everywhere except where the answer is determined by an earlier token,
so the loss and the accuracy count only those answers (docs/data.md, "Recall task").

- copy (induction copy, Olsson et al. 2022): a segment of S = seq_len - copy_len distinct
  symbols drawn from `num_values`, a separator, then the first copy_len symbols again.
  Ids: symbols 0..V-1, separator V. Targets: at the separator and at each copied symbol, the
  next symbol of the segment (copy_len answers per sequence).
- mqar (multi-query associative recall, Arora et al. 2023, after HazyResearch/zoology's
  multiquery_ar): P = num_kv_pairs pairs k_1 v_1 ... k_P v_P, then each key queried once at a
  power-law distributed even slot of the rest; the target at a query key's position is its
  value. Ids: 0 filler, keys 1..K, values K+1..K+V; other positions are random tokens.
- kv (lookup by content, at any number of keys): n pair tokens, each carrying a (key, value),
  then a query token carrying a key; the target at the query is the value of the one pair with
  that key. The right pair sits at a uniform random place and the n - 1 others carry any other
  key (repeats allowed), so no position tells the answer and one attention layer can solve it
  at any n. n is uniform in [min_pairs, seq_len - 1] per training row (rows padded on the
  right, after the query, where no target is) and set per evaluation (lookup_set). Ids, K =
  num_keys, V = num_values: pair (k, v) k*V + v, query k K*V + k, value v K*V + K + v (the
  targets only), pad K*V + K + V.

Batches are pure functions of (data.seed, split, step), so training is exact on resume and
nothing is stored: the training stream draws from np.random.default_rng([seed, 0, step]), the
validation set (val_sequences sequences, fixed) from default_rng([seed, 1]).
"""

from dataclasses import dataclass

import numpy as np
import torch

from data.batching import Batch, BatchShape, first_batches
from data.config import DataConfig, bad
from model.config import IGNORE_INDEX
from model.errors import DataError

TRAIN_STREAM, VAL_STREAM, EVAL_TRAIN_STREAM, LOOKUP_STREAM = 0, 1, 2, 3
TASKS = ("copy", "mqar", "kv")


def check(cfg: DataConfig) -> None:
    """DataError naming the setting unless cfg describes a task that can be generated."""
    if cfg.task not in TASKS:
        raise bad("task", cfg.task, "choose one of copy, mqar, kv (copy: induction copy, the "
                  "default; mqar: associative recall; kv: lookup by content).")
    for key in ("num_values", "num_keys", "num_kv_pairs", "seq_len", "copy_len",
                "val_sequences", "min_pairs"):
        if not isinstance(getattr(cfg, key), int) or getattr(cfg, key) < 1:
            raise bad(key, getattr(cfg, key), "use a positive integer.")
    seg_len = cfg.seq_len - cfg.copy_len
    if cfg.task == "copy" and not cfg.copy_len <= seg_len <= cfg.num_values:
        raise bad("copy_len/seq_len", (cfg.copy_len, cfg.seq_len), "the copy task "
                  "repeats the first copy_len symbols of a segment of seq_len - copy_len "
                  "distinct symbols, so it needs copy_len <= seq_len - copy_len <= "
                  f"data.num_values={cfg.num_values}; lower copy_len or seq_len, or raise "
                  "num_values.")
    if cfg.task == "mqar" and (cfg.seq_len % 2 or 4 * cfg.num_kv_pairs > cfg.seq_len or
                               cfg.num_kv_pairs > min(cfg.num_keys, cfg.num_values)):
        raise bad("num_kv_pairs/seq_len", (cfg.num_kv_pairs, cfg.seq_len), "mqar needs "
                  "an even seq_len with 4 * num_kv_pairs <= seq_len (pairs, then query "
                  "slots with filler between) and num_kv_pairs <= num_keys and <= "
                  "num_values (distinct keys and values).")
    if cfg.task == "kv" and not (cfg.num_keys >= 2 and cfg.min_pairs <= cfg.seq_len - 1):
        raise bad("num_keys/min_pairs/seq_len", (cfg.num_keys, cfg.min_pairs, cfg.seq_len),
                  "kv needs num_keys >= 2 (the other pairs carry another key) and min_pairs "
                  "<= seq_len - 1 (a row is up to seq_len - 1 pairs and the query).")
    if not (type(cfg.seed) is int and cfg.seed >= 0):   # numpy's generators take no other
        raise bad("seed", cfg.seed, "use an integer >= 0; it seeds every stream of the task.")
    if cfg.task == "mqar" and not 0 < cfg.power_a <= 1:
        raise bad("power_a", cfg.power_a, "use a number in (0, 1] (Zoology's 0.01 puts "
                  "most queries early; 1 spreads them evenly).")


def distinct_draws(rng: np.random.Generator, n: int, pool: int, k: int) -> np.ndarray:
    """k distinct values of range(pool) per row, uniformly: (n, k)."""
    return np.argsort(rng.random((n, pool)), axis=1)[:, :k]


def copy_task(rng: np.random.Generator, n: int, seq_len: int, copy_len: int,
              num_values: int) -> tuple[np.ndarray, np.ndarray]:
    """Induction copy sequences: (inputs, targets), each (n, seq_len) int64."""
    seg_len = seq_len - copy_len
    seg = distinct_draws(rng, n, num_values, seg_len)                 # (n, S)
    sep = np.full((n, 1), num_values)                                  # (n, 1)
    inputs = np.concatenate([seg, sep, seg[:, :copy_len - 1]], axis=1)  # (n, S + 1 + M - 1)
    targets = np.full_like(inputs, IGNORE_INDEX)
    targets[:, seg_len:] = seg[:, :copy_len]   # the separator and each copy predict what follows
    return inputs, targets


def mqar(rng: np.random.Generator, n: int, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """MQAR sequences of cfg's sizes (seq_len, num_kv_pairs, num_keys, num_values, power_a):
    (inputs, targets), each (n, seq_len) int64."""
    P, T, num_keys, num_values = cfg.num_kv_pairs, cfg.seq_len, cfg.num_keys, cfg.num_values
    keys = 1 + distinct_draws(rng, n, num_keys, P)                    # (n, P)
    values = 1 + num_keys + distinct_draws(rng, n, num_values, P)     # (n, P)
    inputs = np.zeros((n, T), dtype=np.int64)
    targets = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    inputs[:, 0:2 * P:2], inputs[:, 1:2 * P:2] = keys, values
    # query slots without replacement, p(g) ~ (g+1)^(a-1): Gumbel top-k, as Zoology's choice()
    space = (T - 2 * P) // 2
    logp = (cfg.power_a - 1) * np.log(np.arange(1, space + 1))
    gumbel = logp[None, :] - np.log(-np.log(rng.random((n, space))))  # (n, space)
    qpos = 2 * P + 2 * np.argsort(-gumbel, axis=1)[:, :P]             # (n, P) query positions
    np.put_along_axis(inputs, qpos, keys, axis=1)
    np.put_along_axis(targets, qpos, values, axis=1)
    fill = rng.integers(0, vocab_size_of(num_keys, num_values, "mqar"), size=(n, T))
    blank = inputs == 0
    inputs[blank] = fill[blank]   # Zoology's random_non_queries: filler is any token
    return inputs, targets


def kv_lookup(rng: np.random.Generator, n: int, cfg: DataConfig,
              pairs: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lookup rows (the module docstring): (inputs, targets) (n, T) int64 and the place of the
    right pair (n,). Each row has P pairs, P uniform in [min_pairs, seq_len - 1] with T =
    seq_len, or P = `pairs` for every row with T = pairs + 1."""
    K, V = cfg.num_keys, cfg.num_values
    T = cfg.seq_len if pairs is None else pairs + 1
    P = (rng.integers(cfg.min_pairs, T, size=n) if pairs is None
         else np.full(n, pairs))                                       # (n,) pairs per row
    query = rng.integers(0, K, size=n)                                 # (n,) the key asked for
    keys = rng.integers(0, K - 1, size=(n, T - 1))                     # (n, T-1) other keys
    keys += keys >= query[:, None]                                     # ... never the query's
    values = rng.integers(0, V, size=(n, T - 1))                       # (n, T-1)
    right = (rng.random(n) * P).astype(np.int64)                       # (n,) in [0, P)
    rows = np.arange(n)
    keys[rows, right] = query
    inputs = np.full((n, T), K * V + K + V, dtype=np.int64)            # pad everywhere first
    slots = np.arange(T - 1)[None, :] < P[:, None]                     # (n, T-1) real pairs
    inputs[:, :T - 1] = np.where(slots, keys * V + values, inputs[:, :T - 1])
    inputs[rows, P] = K * V + query
    targets = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    targets[rows, P] = K * V + K + values[rows, right]
    return inputs, targets, right


def vocab_size_of(num_keys: int, num_values: int, task: str) -> int:
    if task == "kv":   # pairs, queries, values, pad
        return num_keys * num_values + num_keys + num_values + 1
    return num_values + 1 if task == "copy" else 1 + num_keys + num_values


def generate(cfg: DataConfig, rng: np.random.Generator, n: int):
    """n sequences of cfg.task: (inputs, targets), each (n, cfg.seq_len)."""
    if cfg.task == "copy":
        return copy_task(rng, n, cfg.seq_len, cfg.copy_len, cfg.num_values)
    if cfg.task == "kv":
        return kv_lookup(rng, n, cfg)[:2]
    return mqar(rng, n, cfg)


def lookup_set(cfg: DataConfig, pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lookup evaluation at `pairs` keys: val_sequences rows of exactly that many pairs from
    rng([seed, 3, pairs]), the same for every run: inputs, targets (n, pairs + 1), right (n,)."""
    rng = np.random.default_rng([cfg.seed, LOOKUP_STREAM, pairs])
    return kv_lookup(rng, cfg.val_sequences, cfg, pairs)


@dataclass
class RecallData:
    """A generated task as the trainer reads its data (data.batching.TrainingData; no corpus,
    no cache). Its batches come from data.seed, whatever trainer.seed."""

    cfg: DataConfig
    scores_answers = True      # only answers are targets: evaluations report accuracy

    def __post_init__(self):
        check(self.cfg)

    @property
    def vocab_size(self) -> int:
        return vocab_size_of(self.cfg.num_keys, self.cfg.num_values, self.cfg.task)

    @property
    def pad_id(self) -> int:   # kv pads after the query; generation needs an id for prompts
        if self.cfg.task == "kv":
            return self.vocab_size - 1
        return self.cfg.num_values if self.cfg.task == "copy" else 0

    eot_id = pad_id
    tokenizer_path = None      # ids are symbols, there is no text tokenizer to copy
    val = None                 # no token split: the end-of-run score reads whole_validation

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess over the values."""
        return 1.0 / self.cfg.num_values

    @property
    def meta(self) -> dict:
        """run.json's `data`: the task and its sizes (no bytes: bits per byte is undefined)."""
        answers = {"copy": self.cfg.copy_len, "mqar": self.cfg.num_kv_pairs, "kv": 1}[self.cfg.task]
        return {"task": self.cfg.task, "seq_len": self.cfg.seq_len,
                "vocab_size": self.vocab_size, "answers_per_sequence": answers,
                "val_sequences": self.cfg.val_sequences, "chance_accuracy": self.chance}

    def accuracy(self, name: str, value) -> dict:
        """{name: value}: the targets are answers, and the share answered right is the result."""
        return {name: value}

    def val_bpb(self, loss: float) -> None:
        """None: symbols have no bytes; evaluations report accuracy (scores_answers)."""

    def encode(self, text: str) -> list[int]:
        raise DataError("The recall task has symbol ids, not text, so trainer.sample_prompts "
                        "cannot be encoded; leave trainer.sample_prompts at its default, [].")

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)

    def describe(self) -> str:
        """The start line's data part: what is generated, and the chance accuracy."""
        pairs = (f" ({self.cfg.min_pairs} to {self.cfg.seq_len - 1} pairs)"
                 if self.cfg.task == "kv" else "")
        return (f"{self.cfg.task}{pairs} sequences of {self.cfg.seq_len} tokens generated from "
                f"data.seed={self.cfg.seed}, {self.cfg.val_sequences:,} val sequences, vocab "
                f"{self.vocab_size}; chance accuracy 1/{self.cfg.num_values} = {self.chance:.4f}")


    def batches(self, shape: BatchShape, n_eval: int,
                seed: int) -> tuple[dict[str, list[Batch]], "RecallBatcher"]:
        """TrainingData.batches: the first n_eval validation batches, n_eval fresh training
        batches of their own stream, and the training stream (`seed` is not used: data.seed
        fixes every stream)."""
        if shape.block_size != self.cfg.seq_len:
            raise DataError(f"model.block_size={shape.block_size} differs from data.seq_len="
                            f"{self.cfg.seq_len}: a recall sequence is one block. Set "
                            "model.block_size=${data.seq_len} (model=recall does).")
        fixed = {"val": validation_batches(self.cfg, shape, limit=n_eval),
                 "train": first_batches(RecallBatcher(self.cfg, shape, EVAL_TRAIN_STREAM), n_eval)}
        return fixed, RecallBatcher(self.cfg, shape)

    def whole_validation(self, shape: BatchShape) -> list[Batch]:
        """The whole validation set, for the end-of-run score."""
        return validation_batches(self.cfg, shape)


def to_batch(inputs: np.ndarray, targets: np.ndarray) -> Batch:
    return Batch(torch.from_numpy(inputs), torch.from_numpy(targets), None)


class RecallBatcher:
    """Training batches of fresh sequences; batch `step` comes from rng([seed, 0, step]), so the
    state is the step counter (the interface of data.batching.Batcher)."""

    def __init__(self, cfg: DataConfig, shape: BatchShape, stream: int = TRAIN_STREAM):
        self.cfg, self.batch_size, self.stream, self.step = cfg, shape.batch_size, stream, 0
        self.rows = shape.rows   # this rank's rows of the global batch

    def next(self) -> Batch:
        rng = np.random.default_rng([self.cfg.seed, self.stream, self.step])
        self.step += 1
        inputs, targets = generate(self.cfg, rng, self.batch_size)
        return to_batch(inputs[self.rows], targets[self.rows])

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.cfg.seed, "task": self.cfg.task,
                "batch_size": self.batch_size, "seq_len": self.cfg.seq_len}

    def load_state_dict(self, d: dict) -> None:
        self.step = int(d["step"])


def validation_set(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """The whole validation set: val_sequences sequences from rng([seed, 1])."""
    return generate(cfg, np.random.default_rng([cfg.seed, VAL_STREAM]), cfg.val_sequences)


def validation_batches(cfg: DataConfig, shape: BatchShape,
                       limit: int | None = None) -> list[Batch]:
    """The validation set in global batches of shape.batch_size, this rank's rows of each (the
    first `limit` global batches, or all; a short last batch included)."""
    inputs, targets = validation_set(cfg)
    starts = range(0, len(inputs), shape.batch_size)[:limit]
    rows = [(start + shape.rows.start, min(start + shape.rows.stop, len(inputs)))
            for start in starts]
    return [to_batch(inputs[lo:hi].copy(), targets[lo:hi].copy()) for lo, hi in rows if lo < hi]
