"""DataConfig: which corpus, which tokenizer, how batches are packed (Hydra group `data`).

Every field is documented in configs/data/*.yaml. Validation runs when the config is built,
so a typo in a source name fails before anything is downloaded or tokenised.
"""

from dataclasses import dataclass
from typing import Optional

from data.errors import DataError

SOURCES = ("shakespeare", "hub", "text")
TOKENIZERS = ("char", "bpe")
PACKINGS = ("concat", "pad")
TOKEN_DTYPES = ("auto", "uint16", "uint32")
# What one document is, per source; the padded batching mode never crosses a document.
DOCUMENTS = {
    "shakespeare": ("work",),
    "hub": ("row", "line", "paragraph", "article"),
    "text": ("file", "line", "paragraph"),
}
# Byte-level BPE needs its 256 byte symbols plus the two special tokens; uint32 ids cap the top.
MIN_BPE_VOCAB = 256 + 2
MAX_VOCAB = 2**32 - 1


def _bad(field: str, value, fix: str) -> DataError:
    return DataError(f"data.{field}={value!r} is not valid: {fix}")


@dataclass(frozen=True)
class DataConfig:
    source: str = "shakespeare"
    name: str = "shakespeare"
    tokenizer: str = "char"
    vocab_size: int = 4096
    packing: str = "concat"
    cache_dir: Optional[str] = None
    hub_id: Optional[str] = None
    hub_config: Optional[str] = None
    train_split: str = "train"
    val_split: str = "validation"
    text_field: str = "text"
    document: str = "work"
    train_files: Optional[list[str]] = None
    val_files: Optional[list[str]] = None
    val_fraction: float = 0.1
    token_dtype: str = "auto"

    def __post_init__(self):
        if self.source not in SOURCES:
            raise _bad("source", self.source, f"choose one of {', '.join(SOURCES)} "
                       "(or pick a file from configs/data/ with data=<name>).")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise _bad("name", self.name, "use a short non-empty name without '/', "
                       "it becomes part of the cache folder name.")
        if self.tokenizer not in TOKENIZERS:
            raise _bad("tokenizer", self.tokenizer, f"choose one of {', '.join(TOKENIZERS)}.")
        if self.tokenizer == "bpe" and not MIN_BPE_VOCAB <= self.vocab_size <= MAX_VOCAB:
            raise _bad("vocab_size", self.vocab_size, f"byte-level BPE needs at least "
                       f"{MIN_BPE_VOCAB} ids (256 bytes + pad + end-of-text) and at most "
                       f"{MAX_VOCAB} (the uint32 token file limit).")
        if self.packing not in PACKINGS:
            raise _bad("packing", self.packing, f"choose one of {', '.join(PACKINGS)}.")
        if self.document not in DOCUMENTS[self.source]:
            raise _bad("document", self.document, f"source {self.source!r} supports "
                       f"{', '.join(DOCUMENTS[self.source])}.")
        if self.source == "hub" and not self.hub_id:
            raise _bad("hub_id", self.hub_id, "the hub source needs a dataset id such as "
                       "'Salesforce/wikitext' or a local folder laid out like a hub dataset.")
        if self.source == "text" and not self.train_files:
            raise _bad("train_files", self.train_files, "the text source needs a list of "
                       "files or globs, e.g. data.train_files=[/path/to/*.txt].")
        if self.token_dtype not in TOKEN_DTYPES:
            raise _bad("token_dtype", self.token_dtype, f"choose one of {', '.join(TOKEN_DTYPES)}"
                       " (auto: uint16 when the vocabulary fits in 65,536 ids, else uint32).")
        if not 0.0 < self.val_fraction < 1.0:
            raise _bad("val_fraction", self.val_fraction, "use a fraction strictly between "
                       "0 and 1 (used by the text source when val_files is not given).")
