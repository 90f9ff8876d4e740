"""data/config.py and configs/data/*.yaml: the Hydra schema is exactly DataConfig."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from data.config import DataConfig
from data.errors import DataError

CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "data").glob("*.yaml"))


def test_every_source_has_a_config():
    assert {p.stem for p in CONFIGS} >= {"shakespeare", "tinyshakespeare", "wikitext2",
                                        "wikitext103", "tinystories", "text"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_keys_are_the_dataclass_fields_each_commented(path):
    fields = [f.name for f in dataclasses.fields(DataConfig)]
    values = yaml.safe_load(path.read_text())
    assert list(values) == fields
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            assert "  # " in line, f"{path.name}: undocumented line {line!r}"
    if values["source"] == "text":
        values["train_files"] = ["some.txt"]
    cfg = DataConfig(**values)
    assert cfg.name == path.stem


@pytest.mark.parametrize("field, value, needle", [
    ("source", "nope", "data.source='nope'"),
    ("tokenizer", "word", "data.tokenizer"),
    ("packing", "ragged", "data.packing"),
    ("document", "chapter", "data.document"),
    ("token_dtype", "int8", "data.token_dtype"),
    ("val_fraction", 1.0, "data.val_fraction"),
    ("name", "a/b", "data.name"),
])
def test_bad_fields_name_the_field(field, value, needle):
    with pytest.raises(DataError, match=needle.replace(".", r"\.")):
        DataConfig(**{field: value})


def test_cross_field_checks():
    with pytest.raises(DataError, match="data.vocab_size=100"):
        DataConfig(tokenizer="bpe", vocab_size=100)
    with pytest.raises(DataError, match="hub_id"):
        DataConfig(source="hub", document="row")
    with pytest.raises(DataError, match="train_files"):
        DataConfig(source="text", document="file")
