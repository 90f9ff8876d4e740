"""data/config.py and configs/data/*.yaml: option files state only what differs from the schema
defaults, every hub corpus pins a revision, and each option composes through Hydra."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from data.config import DataConfig
from model.errors import DataError, UserError
from scripts import baselines, prepare_data
from scripts.common import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "data").glob("*.yaml"))
DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataConfig)}


def option_values(path: Path) -> dict:
    """An option file's data keys: the file itself, or the `data:` section of a global-package
    file (configs/data/recall.yaml also sets model, optim and trainer keys)."""
    values = yaml.safe_load(path.read_text()) or {}
    return values["data"] if path.read_text().startswith("# @package _global_") else values


def test_every_source_has_a_config():
    assert {p.stem for p in CONFIGS} >= {"shakespeare", "tinyshakespeare", "wikitext2",
                                        "wikitext103", "tinystories", "fineweb_edu", "text"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_option_files_state_only_what_differs_each_commented(path):
    values = option_values(path)
    assert set(values) <= set(DEFAULTS)
    same = [k for k, v in values.items() if v == DEFAULTS[k]]
    assert not same, f"{path.name} repeats schema defaults {same}"
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            assert "  # " in line or " # " in line, f"{path.name}: undocumented line {line!r}"
    if values.get("source") == "text":
        values["train_files"] = ["some.txt"]
    cfg = DataConfig(**{**DEFAULTS, **values})
    assert cfg.name == path.stem
    if cfg.source == "hub":   # a pinned commit (40 hex digits) or the parquet-export ref
        assert cfg.hub_revision == "refs/convert/parquet" or (
            len(cfg.hub_revision) == 40 and int(cfg.hub_revision, 16) >= 0), path.name


@pytest.mark.parametrize("name", [p.stem for p in CONFIGS])
def test_each_option_composes_through_hydra_like_train_py(name):
    overrides = [f"data={name}"]
    if name == "text":
        overrides.append("data.train_files=[some.txt]")
    values = option_values(REPO / "configs" / "data" / f"{name}.yaml")
    cfg = load_config(overrides)
    assert cfg == DataConfig(**{**DEFAULTS, **values,
                                **({"train_files": ["some.txt"]} if name == "text" else {})})


def test_prepare_data_takes_train_py_overrides_and_fails_cleanly(capsys):
    """In process (the exit codes of the command lines: tests/e2e/test_data_scripts.py)."""
    cfg = load_config(["data=text", "data.name=mine", "data.train_files=[a.txt,b.txt]",
                       "data.tokenizer=bpe", "data.shard_tokens=1000", "trainer.max_steps=5"])
    assert (cfg.name, cfg.train_files, cfg.tokenizer, cfg.shard_tokens) == (
        "mine", ["a.txt", "b.txt"], "bpe", 1000)
    for bad, needle in ((["data.nosuchkey=1"], "nosuchkey"),
                        (["data.shard_tokens=abc"], "shard_tokens"),
                        (["data=text"], "train_files")):
        assert prepare_data.main(bad) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and err.startswith("error: "), (bad, err)


@pytest.mark.parametrize("script", [prepare_data, baselines], ids=["prepare_data", "baselines"])
def test_a_generated_task_has_no_corpus_to_prepare_or_score(capsys, script):
    assert script.main(["data=recall"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: data=recall is generated on the fly, not a corpus")
    assert err.count("\n") == 1


@pytest.mark.parametrize("field, value, needle", [
    ("source", "nope", "data.source='nope'"),
    ("tokenizer", "word", "data.tokenizer"),
    ("packing", "ragged", "data.packing"),
    ("document", "chapter", "data.document"),
    ("token_dtype", "int8", "data.token_dtype"),
    ("val_fraction", 1.0, "data.val_fraction"),
    ("name", "a/b", "data.name"),
    ("shard_tokens", 0, "data.shard_tokens"),
])
def test_bad_fields_name_the_field(field, value, needle):
    with pytest.raises(DataError, match=needle.replace(".", r"\.")):
        DataConfig(**{field: value})


@pytest.mark.parametrize("field, value", [("verify", 2), ("streaming", "yes"), ("verify", 0)])
def test_a_switch_takes_true_or_false_only(field, value):
    with pytest.raises(UserError, match=rf"^data\.{field}={value!r} is not valid: use true or "
                                        r"false \(a switch"):
        DataConfig(**{field: value})
    assert getattr(DataConfig(**{field: True}), field) is True


def test_cross_field_checks():
    with pytest.raises(DataError, match="data.vocab_size=100"):
        DataConfig(tokenizer="bpe", vocab_size=100)
    with pytest.raises(DataError, match="hub_id"):
        DataConfig(source="hub", document="row")
    with pytest.raises(DataError, match="train_files"):
        DataConfig(source="text", document="file")
