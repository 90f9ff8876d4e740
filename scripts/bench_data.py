"""Benchmark data preparation: MB/s, peak resident memory and cached-start time.

    python scripts/bench_data.py --mb 1000    # the 1 GB measurement in docs/benchmarks.md
    python scripts/bench_data.py --quick      # 2 MB, for tests/test_data_bench.py

Generates a deterministic English-like corpus (Zipf-distributed words, lines of about 12 words,
paragraphs of 2 to 8 lines) as one file under --dir (never in the repository), then runs
`scripts/prepare_data.py` in a fresh process for each case: tokenizer char or bpe, the file read
as one document (`document=file`) or as many (`document=paragraph`). Each build writes to its own
cache folder and is followed by a second, cached start of the same config. Reported per case:
the build's wall time and peak resident memory (the child's ru_maxrss); MB/s after the tokenizer
exists (text bytes over the seconds prepare records for reading, normalising, encoding and
writing the shards, end to end) and with the tokenizer (over the whole prepare()); and the
cached start: wall time of the whole process and of `prepare()` alone, beside a cached start
of a 100 kB corpus.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORDS_PER_LINE, BLOCK_BYTES = 12, 4 << 20


def vocabulary(n_words: int = 20_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    weights = 1.0 / np.arange(1, len(letters) + 1)
    lengths = rng.integers(1, 11, n_words)
    words = ["".join(rng.choice(letters, n, p=weights / weights.sum())) for n in lengths]
    words[:5] = ["the", "of", "and", "to", "a"]
    return np.array(words)


def write_corpus(path: Path, n_bytes: int, seed: int = 0) -> Path:
    """About `n_bytes` of text in blocks of BLOCK_BYTES, each drawn from its own seed."""
    if path.exists() and path.stat().st_size >= n_bytes:
        return path
    words = vocabulary()
    zipf = 1.0 / np.arange(1, len(words) + 1)
    zipf /= zipf.sum()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        written, block = 0, 0
        while written < n_bytes:
            rng = np.random.default_rng([seed, block])
            n = BLOCK_BYTES // 6
            picked = words[rng.choice(len(words), n, p=zipf)]
            seps = np.full(n, " ", dtype=object)
            seps[WORDS_PER_LINE - 1::WORDS_PER_LINE] = ".\n"
            lines = np.arange(n) // WORDS_PER_LINE
            breaks = (seps == ".\n") & (rng.random(n) < 0.2)   # ~5 lines per paragraph
            seps[breaks & (lines > 0)] = ".\n\n"
            text = "".join(np.char.add(picked.astype(object), seps).tolist())
            text = text[:n_bytes - written] if written + len(text) > n_bytes else text
            f.write(text)
            written += len(text)
            block += 1
    tmp.rename(path)
    return path


def case_overrides(corpus: Path, tokenizer: str, document: str, cache: Path) -> list[str]:
    return ["data=text", f"data.name=bench-{document}", f"data.train_files=[{corpus}]",
            f"data.document={document}", f"data.tokenizer={tokenizer}",
            f"data.cache_dir={cache}"]


def child_peak(overrides: list[str]) -> tuple[dict, float]:
    """Run prepare_data.py under a tiny wrapper that reports its own peak RSS."""
    code = ("import resource, runpy, sys; sys.argv = sys.argv[1:]; "
            "exec('try:\\n runpy.run_path(sys.argv[0], run_name=\"__main__\")\\n"
            "except SystemExit as e:\\n code = e.code\\nelse:\\n code = 0'); "
            "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "file=sys.stderr); sys.exit(code)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts" / "prepare_data.py"),
                           *overrides], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"prepare_data.py {' '.join(overrides)} failed:\n{proc.stderr}")
    m = re.search(r"(reused|built) in ([\d.]+) s", proc.stdout)
    folder = re.search(r"cache: (\S+)", proc.stdout).group(1)
    peak = int(re.search(r"peak_rss_kib (\d+)", proc.stderr).group(1)) / 1024
    return {"wall_s": wall, "prepare_s": float(m.group(2)), "reused": m.group(1) == "reused",
            "meta": json.loads((Path(folder) / "meta.json").read_text())}, peak


def bench(corpus: Path, tokenizers: list[str], documents: list[str], cache: Path) -> list[dict]:
    small = write_corpus(corpus.parent / "small-100kB.txt", 100_000, seed=1)
    child_peak(case_overrides(small, "char", "file", cache))           # build once
    baseline, _ = child_peak(case_overrides(small, "char", "file", cache))
    rows = []
    for tokenizer in tokenizers:
        for document in documents:
            over = case_overrides(corpus, tokenizer, document, cache)
            built, peak = child_peak(over)
            cached, cached_peak = child_peak(over)
            meta = built["meta"]
            text_mb = sum(s["bytes"] for s in meta["splits"].values()) / 1e6
            rows.append({
                "tokenizer": tokenizer, "document": document, "corpus_mb": text_mb,
                "documents": sum(s["documents"] for s in meta["splits"].values()),
                "tokens": sum(s["tokens"] for s in meta["splits"].values()),
                "build_wall_s": built["wall_s"], "tokenizer_s": meta["tokenizer_seconds"],
                "encode_s": meta["encode_seconds"],
                "mb_s_after_tokenizer": text_mb / meta["encode_seconds"],
                "mb_s_with_tokenizer": text_mb / built["prepare_s"],
                "peak_rss_mb": peak, "cached_wall_s": cached["wall_s"],
                "cached_prepare_s": cached["prepare_s"], "cached_peak_rss_mb": cached_peak,
                "baseline_cached_wall_s": baseline["wall_s"],
                "baseline_cached_prepare_s": baseline["prepare_s"],
                "reused": cached["reused"]})
            print(format_row(rows[-1]), file=sys.stderr)
    return rows


HEADER = ("| tokenizer | document | corpus MB | build s | tokenizer s | MB/s after tokenizer | "
          "MB/s with tokenizer | peak RSS MB | cached start s (prepare) | 100 kB cached start s "
          "(prepare) |\n|---|---|---|---|---|---|---|---|---|---|")


def format_row(r: dict) -> str:
    return (f"| {r['tokenizer']} | {r['document']} | {r['corpus_mb']:,.1f} | "
            f"{r['build_wall_s']:.1f} | {r['tokenizer_s']:.1f} | {r['mb_s_after_tokenizer']:.1f} | "
            f"{r['mb_s_with_tokenizer']:.1f} | {r['peak_rss_mb']:,.0f} | "
            f"{r['cached_wall_s']:.2f} ({r['cached_prepare_s']:.2f}) | "
            f"{r['baseline_cached_wall_s']:.2f} ({r['baseline_cached_prepare_s']:.2f}) |")


def positive_mb(value: str) -> float:
    try:
        mb = float(value)
    except ValueError:
        mb = 0.0
    if not mb > 0:
        raise argparse.ArgumentTypeError(f"{value!r}: give a corpus size in MB above 0, e.g. 1000")
    return mb


def names(allowed: tuple[str, ...]):
    """An argparse type: a comma-separated list of `allowed` names."""
    def parse(value: str) -> list[str]:
        picked = value.split(",")
        wrong = [n for n in picked if n not in allowed]
        if wrong:
            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, wrong))}: use a "
                                             f"comma-separated list of {', '.join(allowed)}")
        return picked
    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=positive_mb, default=1000.0, help="corpus size in MB")
    parser.add_argument("--quick", action="store_true", help="a 2 MB corpus (for tests)")
    parser.add_argument("--dir", default="/tmp/attnscale-bench-data",
                        help="where the corpus and caches go (not the repository)")
    parser.add_argument("--tokenizers", type=names(("char", "bpe")), default="char,bpe")
    parser.add_argument("--documents", type=names(("file", "paragraph")),
                        default="file,paragraph")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    n_bytes = int((2 if args.quick else args.mb) * 1e6)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    corpus = write_corpus(folder / f"corpus-{n_bytes}.txt", n_bytes)
    print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:,.1f} MB) ready in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    cache = folder / f"cache-{os.getpid()}"
    rows = bench(corpus, args.tokenizers, args.documents, cache)
    print(HEADER)
    print("\n".join(format_row(r) for r in rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
