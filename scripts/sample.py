"""Generate text from a trained run: one batch of prompts, left-padded, with temperature and top-k.

    python scripts/sample.py outputs/DAY/TIME                       # best.pt, prompt "\\n"
    python scripts/sample.py outputs/DAY/TIME --prompt "ROMEO:" --prompt "JULIET:" \\
        --max_new_tokens 300 --temperature 0.8 --top_k 200 --checkpoint last

Reads RUN_DIR/tokenizer.json and RUN_DIR/checkpoints/{best,last}.pt; needs no data cache.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch
from tokenizers import Tokenizer

from data.tokenizer import encode
from model.errors import UserError
from model.generate import Sampling, generate
from model.gpt import GPT
from trainer.build import choose_threads, pick_device
from trainer.checkpoint_read import CheckpointError, model_config, read


def load_model(run_dir: Path, which: str, device: torch.device) -> tuple[GPT, int]:
    """The run's model with the weights of checkpoints/<which>.pt, and its pad id."""
    path = run_dir / "checkpoints" / f"{which}.pt"
    try:
        ckpt = read(path)
    except CheckpointError as err:
        raise UserError(f"Cannot sample from {err.path}: {err.problem} Sample from a run "
                        "directory trained by this version of train.py (it reads "
                        "checkpoints/best.pt, or last.pt with --checkpoint last).") from None
    model = GPT(model_config(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt["pad_id"]


def sample(run_dir: Path, prompts: list[str], sampling: Sampling, which: str = "best",
           device: Optional[torch.device] = None) -> list[str]:
    """Continuations (prompt included) of each prompt, generated as one batch from the
    checkpoint `which` (best or last)."""
    model, pad_id = load_model(run_dir, which, device or torch.device("cpu"))
    if not (run_dir / "tokenizer.json").is_file():
        raise UserError(f"Cannot sample from {run_dir}: it has no tokenizer.json. Pass the run "
                        "directory that train.py wrote (it holds tokenizer.json and "
                        "checkpoints/).")
    tok = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    ids = [encode(tok, p) for p in prompts]
    if any(len(i) == 0 for i in ids):
        raise UserError("Every --prompt must encode to at least one token; pass e.g. "
                        "--prompt '\\n' for an unconditional sample.")
    outs = generate(model, ids, sampling, pad_id)
    return [p + tok.decode(o, skip_special_tokens=False) for p, o in zip(prompts, outs)]


def threads_arg(value: str):
    if value == "auto":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"--threads {value!r}: use auto or a number >= 0")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompt", action="append", help="repeat for a batch (default: newline)")
    ap.add_argument("--max_new_tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    ap.add_argument("--top_k", type=int, default=200, help="0 = no top-k filter")
    ap.add_argument("--checkpoint", choices=("best", "last"), default="best")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu",
                    help="cpu, cuda, cuda:N, mps, or auto (as trainer.device=auto)")
    ap.add_argument("--threads", type=threads_arg, default="auto",
                    help="CPU threads: auto (as trainer.threads=auto) or a number; 1 on a "
                         "machine that other jobs keep busy; 0 = PyTorch's default")
    args = ap.parse_args(argv)
    threads, _ = choose_threads(args.threads)
    if threads:
        torch.set_num_threads(threads)
    try:
        sampling = Sampling(args.max_new_tokens, args.temperature, args.top_k or None, args.seed)
        texts = sample(args.run_dir, args.prompt or ["\n"], sampling, args.checkpoint,
                       pick_device(args.device, "--device"))
    except UserError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    for text in texts:
        print(text, end="\n" + "-" * 40 + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
