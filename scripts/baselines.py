"""Print (and cache) the unigram, bigram and trigram reference levels of a data config.

    python scripts/baselines.py                                   # the default corpus
    python scripts/baselines.py data=text 'data.train_files=[a.txt]' 'data.val_files=[b.txt]'
    python scripts/baselines.py data.tokenizer=bpe --max-train-tokens 20000000

Takes the same Hydra overrides as train.py. The cross-entropy of the whole validation split
under add-k smoothed n-gram counts of the training split (k chosen on a held-out tail of the
training split, never on validation), in nats per token and bits per byte, in the run's own
tokenization: scripts/report/ngram.py says how. The result is cached as baselines.json in the
corpus's token cache folder; the report (scripts/plot_runs.py) reads it from there.
"""

import argparse
import sys
import time
from pathlib import Path

from data.prepare import prepare
from scripts.common import load_config, readable_errors
from scripts.report import ngram


def describe(result: dict, path: Path, reused: bool) -> str:
    lines = [f"{'cached' if reused else 'computed'}: {path}",
             f"{'model':8} {'nats/token':>11} {'bits/byte':>10} {'k':>8} {'distinct':>12}"]
    for name in ngram.ORDERS.values():
        lines.append(f"{name:8} {result['nats_per_token'][name]:>11.4f} "
                     f"{result['bits_per_byte'][name]:>10.4f} {result['k'][name]:>8.2g} "
                     f"{result['distinct'][name]:>12,}")
    lines.append(f"add-k smoothing, k chosen on the last {result['held_out_tokens']:,} training "
                 f"tokens; counts of {result['train_tokens_counted']:,} training tokens, "
                 f"{result['val_tokens']:,} validation tokens scored; vocabulary "
                 f"{result['vocab_size']:,}; computed in {result['seconds']:.1f} s")
    if result["capped"]:
        lines.append(f"capped: only the first {result['train_tokens_counted']:,} of "
                     f"{result['train_tokens']:,} training tokens were counted "
                     "(--max-train-tokens)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for train.py")
    parser.add_argument("--max-train-tokens", type=int, default=ngram.MAX_TRAIN_TOKENS,
                        help="count at most this many training tokens (the first ones)")
    args = parser.parse_args(argv)
    if args.max_train_tokens < 2:
        print("error: --max-train-tokens must be at least 2.", file=sys.stderr)
        return 2
    def command() -> None:
        start = time.perf_counter()
        data = prepare(load_config(args.overrides))
        settings = ngram.Settings(max_train_tokens=args.max_train_tokens)
        result, reused = ngram.cached(data, settings)
        print(describe(result, data.folder / ngram.FILE, reused))
        print(f"wall time {time.perf_counter() - start:.1f} s")
    return readable_errors(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
