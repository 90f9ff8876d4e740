"""Golden batches: the rows, targets, masks and sampler states that data/batching.py's Batcher
(concat), data/padded.py's PaddedBatcher (pad), data/recall.py's RecallBatcher and validation
batches, and each TrainingData.batches draw, against tests/golden/batches.json. A checkpoint's
sampler state resumes the batches it was written with only while these hold.

Each case's batches are stored as their count, the first row of the first batch, the SHA-256 of
every tensor's bytes (idx, targets, valid mask) in order, and the last sampler state. Regenerate
(after an intended change to batching) with
    ATTNSCALE_UPDATE_GOLDEN=1 python -m pytest -p no:xdist tests/data/test_data_golden_batches.py
"""

import hashlib
import json
import os

import numpy as np
import pytest
import torch
from conftest import ROOT

from data.batching import Batch, Batcher, BatchShape, first_batches
from data.config import DataConfig
from data.padded import PaddedBatcher
from data.prepare import PreparedData
from data.recall import (
    EVAL_TRAIN_STREAM,
    TRAIN_STREAM,
    RecallBatcher,
    RecallData,
    validation_batches,
)

GOLDEN = ROOT / "tests" / "golden" / "batches.json"
PAD, EOT = 0, 1


def corpus(seed: int, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents of 1 to 40 tokens (EOT included: 1-token ones have no target), ids >= 2."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 41, size=n_docs)
    docs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = rng.integers(2, 500, size=int(lengths.sum())).astype(np.uint16)
    tokens[np.cumsum(lengths) - 1] = EOT
    return tokens, docs


def batcher(packing: str, tokens, docs, shape: BatchShape, seed: int) -> Batcher:
    if packing == "pad":
        return PaddedBatcher(tokens, docs, shape, PAD, seed)
    return Batcher(tokens, shape, seed)


def record(batches: list[Batch], state=None) -> dict:
    """What the golden file keeps of a list of batches (and the sampler state after them)."""
    digest = hashlib.sha256()
    for b in batches:
        for t in (b.idx, b.targets, b.valid_mask):
            digest.update(b"none" if t is None else f"{t.dtype}{tuple(t.shape)}".encode())
            digest.update(b"" if t is None else t.numpy().tobytes())
    return {"batches": len(batches), "first_row": batches[0].idx[0].tolist() if batches else [],
            "sha256": digest.hexdigest(), "state": state}


def draw(sampler, steps: int) -> dict:
    return record([sampler.next() for _ in range(steps)], sampler.state_dict())


def draw_ranks(samplers: list, steps: int) -> dict:
    """`steps` batches of each rank's sampler, in rank order, and their states."""
    batches = [s.next() for s in samplers for _ in range(steps)]
    return record(batches, [s.state_dict() for s in samplers])


def token_batchers() -> dict[str, dict]:
    """Concat and pad batchers over world sizes 1-4, two seeds, every rank; a resumed stream;
    the padded layout's document pieces; the fixed first batches."""
    cases = {}
    for packing in ("concat", "pad"):
        for B, T in ((12, 4), (8, 16)):
            tokens, docs = corpus(seed=B + T, n_docs=40)
            for world in (w for w in (1, 2, 3, 4) if B % w == 0):
                for seed in (0, 5):
                    cases[f"{packing} B{B} T{T} world{world} seed{seed}"] = draw_ranks(
                        [batcher(packing, tokens, docs, BatchShape(B, T, rank, world), seed)
                         for rank in range(world)], 12)
        tokens, docs = corpus(seed=1, n_docs=30)
        first = batcher(packing, tokens, docs, BatchShape(6, 8, 1, 2), 3)
        for _ in range(11):
            first.next()
        resumed = batcher(packing, tokens, docs, BatchShape(6, 8, 1, 2), 3)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as a checkpoint
        cases[f"{packing} resumed after 11"] = draw(resumed, 9)
        tokens, docs = corpus(seed=9, n_docs=20)
        cases[f"{packing} first_batches"] = record(
            first_batches(batcher(packing, tokens, docs, BatchShape(4, 4), 0), 5))
    for seed in range(4):
        tokens, docs = corpus(seed, n_docs=25)
        pieces = [PaddedBatcher(tokens, docs, BatchShape(2, T), PAD, 0).pieces.tolist()
                  for T in (1, 3, 4, 16, 64)]
        cases[f"pad pieces seed{seed}"] = {"sha256": hashlib.sha256(
            json.dumps(pieces).encode()).hexdigest()}
    return cases


def prepared_batches() -> dict[str, dict]:
    """PreparedData.batches: the fixed evaluation batches and the training sampler per rank."""
    train, train_docs = corpus(seed=2, n_docs=50)
    val, val_docs = corpus(seed=3, n_docs=12)
    cases = {}
    for packing in ("concat", "pad"):
        data = PreparedData(tokenizer=None, tokenizer_path=None, train=train, val=val,
                            train_docs=train_docs, val_docs=val_docs, meta={}, vocab_size=500,
                            pad_id=PAD, eot_id=EOT, packing=packing)
        for world in (1, 2, 4):
            made = [data.batches(BatchShape(8, 8, rank, world), n_eval=3, seed=11)
                    for rank in range(world)]
            name = f"prepared {packing} world{world}"
            cases.update({f"{name} {split}": record([b for fixed, _ in made for b in fixed[split]])
                          for split in made[0][0]})
            cases[f"{name} sampler"] = draw_ranks([m[1] for m in made], 12)
    return cases


def recall_cfg(**kw) -> DataConfig:
    return DataConfig(source="recall", name="recall", document="sequence", **kw)


def recall_batches() -> dict[str, dict]:
    """RecallBatcher's streams, validation batches (a short last batch, ranks without rows)
    and RecallData.batches, for the copy and MQAR tasks."""
    cases = {}
    for task in ("copy", "mqar"):
        cfg = recall_cfg(task=task, seed=4)
        for stream in (TRAIN_STREAM, EVAL_TRAIN_STREAM):
            for world in (1, 2, 4):
                cases[f"recall {task} stream{stream} world{world}"] = draw_ranks(
                    [RecallBatcher(cfg, BatchShape(8, cfg.seq_len, rank, world), stream)
                     for rank in range(world)], 4)
        cfg = recall_cfg(task=task, val_sequences=50, seed=2)
        for world in (1, 2):
            made = [RecallData(cfg).batches(BatchShape(16, cfg.seq_len, rank, world), n_eval=4,
                                            seed=123) for rank in range(world)]
            name = f"recall data {task} world{world}"
            cases.update({f"{name} {split}": record([b for fixed, _ in made for b in fixed[split]])
                          for split in made[0][0]})
            cases[f"{name} sampler"] = draw_ranks([m[1] for m in made], 3)
    cfg = recall_cfg(val_sequences=130, seq_len=40, copy_len=8)
    for world in (1, 2, 3, 4):
        shapes = [BatchShape(12, cfg.seq_len, rank, world) for rank in range(world)]
        for limit in (None, 1, 2, 11, 12):
            cases[f"recall validation world{world} limit{limit}"] = record(
                [b for shape in shapes for b in validation_batches(cfg, shape, limit=limit)])
        cases[f"recall whole validation world{world}"] = record(
            [b for shape in shapes for b in RecallData(cfg).whole_validation(shape)])
    return cases


@pytest.mark.parametrize("cases", [token_batchers, prepared_batches, recall_batches])
def test_batches_are_the_golden_ones(cases):
    drawn = cases()
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("ATTNSCALE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps({**golden, **drawn}, indent=0, sort_keys=True) + "\n")
        golden = {**golden, **drawn}
    assert drawn == {name: golden[name] for name in drawn}


def test_a_resumed_sampler_continues_the_stream():
    """The resumed case above is the uninterrupted stream's continuation, not only itself."""
    tokens, docs = corpus(seed=1, n_docs=30)
    for packing in ("concat", "pad"):
        whole = batcher(packing, tokens, docs, BatchShape(6, 8, 1, 2), 3)
        for _ in range(11):
            whole.next()
        assert draw(whole, 9) == json.loads(GOLDEN.read_text())[f"{packing} resumed after 11"]


def test_the_hash_sees_a_single_changed_token():
    tokens, docs = corpus(seed=1, n_docs=30)
    batches = first_batches(Batcher(tokens, BatchShape(4, 4), 0), 2)
    changed = [Batch(b.idx.clone(), b.targets, b.valid_mask) for b in batches]
    changed[1].idx[3, 3] += 1
    assert record(changed)["sha256"] != record(batches)["sha256"]
    assert torch.equal(changed[0].idx, batches[0].idx)
