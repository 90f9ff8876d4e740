"""Prepare (or reuse) the token cache of a data config and print the split sizes.

    python scripts/prepare_data.py                                  # the default corpus
    python scripts/prepare_data.py data.tokenizer=bpe data.vocab_size=4096
    python scripts/prepare_data.py data=text data.name=mine 'data.train_files=[books/*.txt]'
    python scripts/prepare_data.py data.cache_dir=/tmp/fresh        # time a build from scratch
    python scripts/prepare_data.py data.verify=true                 # re-read and compare

Takes the same overrides as train.py: the config is composed from configs/ with Hydra's
compose API and the schema of trainer/schema.py, so a misspelt key fails the same way. While a
cache is built, a progress bar shows the bytes read and MB/s.
"""

import sys
import time

from data.prepare import prepare
from scripts.common import load_config, readable_errors


def report(data, seconds: float) -> str:
    m = data.meta
    lines = [f"data={m['name']} tokenizer={m['tokenizer']} vocab={data.vocab_size} "
             f"dtype={m['dtype']} {'reused' if data.reused else 'built'} in {seconds:.2f} s",
             f"cache: {data.folder}"]
    if not data.reused:
        mb = sum(s["bytes"] for s in m["splits"].values()) / 1e6
        lines.append(f"tokenizer {m['tokenizer_seconds']:.2f} s, encoding {mb:,.1f} MB in "
                     f"{m['encode_seconds']:.2f} s ({mb / max(m['encode_seconds'], 1e-9):.1f} "
                     "MB/s)")
    lines.append(f"{'split':6} {'documents':>10} {'characters':>14} {'bytes':>14} "
                 f"{'tokens':>14} {'shards':>7} {'bytes/token':>12}")
    for split in ("train", "val"):
        s = m["splits"][split]
        lines.append(f"{split:6} {s['documents']:>10,} {s['characters']:>14,} {s['bytes']:>14,} "
                     f"{s['tokens']:>14,} {len(s['shards']):>7} {s['bytes_per_token']:>12.4f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0

    def command() -> None:
        cfg = load_config(argv)
        start = time.perf_counter()
        data = prepare(cfg)
        print(report(data, time.perf_counter() - start))
    return readable_errors(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
