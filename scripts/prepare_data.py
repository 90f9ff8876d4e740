"""Prepare (or reuse) the token cache of a data config and print the split sizes.

    python scripts/prepare_data.py                          # configs/data/shakespeare.yaml
    python scripts/prepare_data.py --data shakespeare --set tokenizer=bpe
    python scripts/prepare_data.py --set cache_dir=/tmp/fresh   # time a build from scratch

Reads configs/data/<name>.yaml directly (no Hydra: this is a data tool), applies the
`--set key=value` overrides (values parsed as YAML) and calls data.prepare.prepare.
"""

import argparse
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data.config import DataConfig  # noqa: E402
from data.errors import DataError  # noqa: E402
from data.prepare import prepare  # noqa: E402


def load_config(name: str, overrides: list[str]) -> DataConfig:
    path = ROOT / "configs" / "data" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise DataError(f"No data config {path}; choose one of {known}.")
    fields = yaml.safe_load(path.read_text())
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise DataError(f"--set {item!r}: use key=value with a DataConfig field "
                            f"({', '.join(fields)}).")
        fields[key] = yaml.safe_load(value)
    return DataConfig(**fields)


def report(data, seconds: float) -> str:
    m = data.meta
    lines = [f"data={m['name']} tokenizer={m['tokenizer']} vocab={data.vocab_size} "
             f"dtype={m['dtype']} {'reused' if data.reused else 'built'} in {seconds:.2f} s",
             f"cache: {data.tokenizer_path.parent}",
             f"{'split':6} {'documents':>10} {'characters':>12} {'bytes':>12} {'tokens':>12} "
             f"{'bytes/token':>12}"]
    for split in ("train", "val"):
        s = m["splits"][split]
        lines.append(f"{split:6} {s['documents']:>10,} {s['characters']:>12,} {s['bytes']:>12,} "
                     f"{s['tokens']:>12,} {s['bytes_per_token']:>12.4f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="shakespeare", help="a file name in configs/data/")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="DataConfig overrides, e.g. tokenizer=bpe vocab_size=4096")
    args = parser.parse_args()
    try:
        start = time.perf_counter()
        data = prepare(load_config(args.data, args.set))
        print(report(data, time.perf_counter() - start))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
