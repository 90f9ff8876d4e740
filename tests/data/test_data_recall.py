"""data=recall: the generators' layout and determinism, train/validation disjointness, the
accuracy count, config validation, and a short run of train.train (the exit code of a bad
command line: tests/e2e/test_data_scripts.py)."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import make_config

import train
from data.batching import BatchShape
from data.config import DataConfig
from data.recall import (
    RecallBatcher,
    RecallData,
    check,
    copy_task,
    kv_lookup,
    lookup_set,
    mqar,
    validation_batches,
    validation_set,
)
from model.config import IGNORE_INDEX
from model.errors import DataError
from trainer.evaluate import accuracy_counts


def recall_cfg(**kw) -> DataConfig:
    return DataConfig(source="recall", name="recall", document="sequence", **kw)


def shape(batch_size: int, rank: int = 0, world: int = 1) -> BatchShape:
    return BatchShape(batch_size, DataConfig.seq_len, rank, world)


def test_copy_layout():
    S, M, V = 12, 5, 16
    x, y = copy_task(np.random.default_rng(3), 200, S + M, M, V)
    assert x.shape == y.shape == (200, S + M)
    seg = x[:, :S]
    assert all(len(set(row)) == S for row in seg) and seg.min() >= 0 and seg.max() < V
    assert (x[:, S] == V).all()                                   # the separator
    answered = y != IGNORE_INDEX
    assert (answered[:, :S].sum() == 0) and answered[:, S:].all()   # M answers, after the segment
    assert (y[:, S:] == seg[:, :M]).all()                         # the segment, in order
    assert (x[:, S + 1:] == y[:, S:-1]).all()   # each answer is the next input: a copy


def test_mqar_layout():
    P, K, V, T = 4, 10, 12, 32
    cfg = recall_cfg(task="mqar", seq_len=T, num_kv_pairs=P, num_keys=K, num_values=V,
                     power_a=0.01)
    x, y = mqar(np.random.default_rng(0), 300, cfg)
    keys, values = x[:, 0:2 * P:2], x[:, 1:2 * P:2]
    assert keys.min() >= 1 and keys.max() <= K and values.min() > K and values.max() <= K + V
    assert all(len(set(r)) == P for r in keys) and all(len(set(r)) == P for r in values)
    assert x.min() >= 0 and x.max() <= K + V
    for row in range(300):
        pos = np.nonzero(y[row] != IGNORE_INDEX)[0]
        assert len(pos) == P and (pos >= 2 * P).all() and (pos % 2 == 0).all()
        pair = dict(zip(keys[row], values[row]))
        for p in pos:   # at each query, the input is a key and the target is that key's value
            assert x[row, p] in pair and y[row, p] == pair[x[row, p]]


def test_kv_layout_one_pair_carries_the_query_key():
    """Ids (K = 5 keys, V = 3 values): pair (k, v) = 3k + v, query k = 15 + k, value v = 20 + v,
    pad 23; each row has P pairs, then the query, then pads; only the query has a target."""
    cfg = recall_cfg(task="kv", num_keys=5, num_values=3, seq_len=12, min_pairs=4)
    x, y, right = kv_lookup(np.random.default_rng(0), 400, cfg)
    assert x.shape == y.shape == (400, 12) and RecallData(cfg).vocab_size == 24
    seen = set()
    for row in range(400):
        P = int(np.nonzero(x[row] >= 15)[0][0])   # the first non-pair token is the query
        seen.add(P)
        assert x[row, P] < 20 and (x[row, P + 1:] == 23).all() and (x[row, :P] < 15).all()
        key = x[row, P] - 15
        keys, values = x[row, :P] // 3, x[row, :P] % 3
        assert list(np.nonzero(keys == key)[0]) == [right[row]]   # one pair has the key
        assert np.nonzero(y[row] != IGNORE_INDEX)[0].tolist() == [P]
        assert y[row, P] == 20 + values[right[row]]
    assert seen == set(range(4, 12))   # P uniform in [min_pairs, seq_len - 1]


def test_kv_right_pair_is_anywhere_and_lookup_sets_have_n_pairs():
    cfg = recall_cfg(task="kv", num_keys=8, num_values=4, val_sequences=3000)
    x, y, right = lookup_set(cfg, 50)
    assert x.shape == (3000, 51) and (y[:, :-1] == IGNORE_INDEX).all()
    counts = np.bincount(right, minlength=50)
    assert counts.min() > 25 and counts.max() < 100   # about 60 per place: no favoured place
    again = lookup_set(cfg, 50)
    assert all(np.array_equal(a, b) for a, b in zip((x, y, right), again))   # fixed set
    assert not np.array_equal(lookup_set(cfg, 49)[0][:, :49], x[:, :49])   # its own stream


@pytest.mark.parametrize("task", ["copy", "mqar", "kv"])
def test_batches_are_a_function_of_seed_and_step(task):
    cfg = recall_cfg(task=task)
    a, b = RecallBatcher(cfg, shape(8)), RecallBatcher(cfg, shape(8))
    first = [a.next().idx for _ in range(3)]
    b.load_state_dict({**a.state_dict(), "step": 2})            # resume at step 2
    assert torch.equal(b.next().idx, first[2])
    assert not torch.equal(first[0], first[1])
    other = RecallBatcher(replace(cfg, seed=1), shape(8)).next().idx
    assert not torch.equal(other, first[0])
    halves = [RecallBatcher(cfg, shape(8, rank=r, world=2)).next().idx for r in (0, 1)]
    assert torch.equal(torch.cat(halves), first[0])            # ranks split one global batch
    x1, _ = validation_set(cfg)
    x2, _ = validation_set(cfg)
    assert np.array_equal(x1, x2)


@pytest.mark.parametrize("task", ["copy", "mqar", "kv"])
def test_validation_sequences_never_appear_in_training(task):
    cfg = recall_cfg(task=task, val_sequences=500)
    val = {row.tobytes() for row in validation_set(cfg)[0]}
    batcher = RecallBatcher(cfg, shape(100))
    train = [row.numpy().tobytes() for _ in range(50) for row in batcher.next().idx]
    assert len(val) == 500 and not val & set(train)
    assert len(set(train)) == len(train)                      # and steps are not replayed


def test_validation_batches_cover_the_set_once():
    cfg = recall_cfg(val_sequences=130)
    inputs, _ = validation_set(cfg)
    for world in (1, 2):
        rows = [b.idx for r in range(world)
                for b in validation_batches(cfg, shape(64, rank=r, world=world))]
        got = sorted(row.numpy().tobytes() for b in rows for row in b)
        assert got == sorted(row.tobytes() for row in inputs)
    assert len(validation_batches(cfg, shape(64), limit=1)) == 1


def test_accuracy_counts_a_hand_made_example():
    targets = torch.tensor([[IGNORE_INDEX, 2, 0], [1, IGNORE_INDEX, 2]])      # 4 answers
    logits = torch.zeros(2, 3, 3)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 1] = 1.0    # ignored, right, wrong
    logits[1, 0, 1] = logits[1, 1, 0] = logits[1, 2, 2] = 1.0    # right, ignored, right
    assert accuracy_counts(logits, targets).tolist() == [3.0, 4.0]


@pytest.mark.parametrize("kw, key", [
    ({"task": "induction"}, "data.task"),
    ({"seq_len": 200}, "data.copy_len/seq_len"),          # segment of 168 > 128 symbols
    ({"copy_len": 50}, "data.copy_len/seq_len"),          # copy longer than the segment
    ({"val_sequences": 0}, "data.val_sequences"),
    ({"task": "mqar", "seq_len": 30}, "data.num_kv_pairs/seq_len"),   # 4 * 8 > 30
    ({"task": "mqar", "num_keys": 4}, "data.num_kv_pairs/seq_len"),
    ({"task": "mqar", "power_a": 0.0}, "data.power_a"),
    ({"task": "kv", "num_keys": 1}, "data.num_keys/min_pairs/seq_len"),
    ({"task": "kv", "min_pairs": 96}, "data.num_keys/min_pairs/seq_len"),
    ({"task": "kv", "min_pairs": 0}, "data.min_pairs"),
    ({"seed": -1}, "data.seed"),                          # numpy seeds no negative number
])
def test_bad_recall_config_names_the_key(kw, key):
    """The recall checks live in data/recall.py: a DataConfig holds the values, building the
    task (RecallData, what the trainer builds) refuses them."""
    cfg = recall_cfg(**kw)
    with pytest.raises(DataError, match=key.replace("/", ".")):
        check(cfg)
    with pytest.raises(DataError, match=key.replace("/", ".")):
        RecallData(cfg)


def test_recall_run_writes_accuracy(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = make_config(["data=recall", "trainer.max_steps=4", "trainer.eval_every=2",
                       "trainer.batch_size=16", "data.val_sequences=100", "trainer.threads=1"])
    train.train(cfg, run_dir)
    assert "chance accuracy 1/128 = 0.0078" in capsys.readouterr().out
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(0 <= r["val_accuracy"] <= 1 and r["val_bpb"] is None for r in evals)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["full_eval_targets"] == 100 * 32               # every validation answer
    assert 0 <= summary["final_val_accuracy"] <= 1 and summary["final_val_bpb_full"] is None
    assert summary["final_val_loss_full"] == pytest.approx(evals[-1]["val_loss"], rel=0.1)
    with pytest.raises(DataError, match="data.seq_len"):   # model=tiny: block_size 64, not 96
        train.train(make_config(["data=recall", "model=tiny"]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
