"""trainer.sample_prompts: samples.txt at the end of a run, a continuation of each prompt by the
weights of best.pt (scripts/sample.py samples from any run afterwards)."""

from pathlib import Path

from model.generate import Sampling, generate
from model.gpt import eval_mode
from trainer.build import Run
from trainer.checkpoint_read import read


def write_samples(run: Run, run_dir: Path, best: Path) -> None:
    """samples.txt: a continuation of each prompt by `best`'s weights (if written)."""
    model, train_cfg = run.state.model, run.config.train_cfg
    if best.exists():
        model.load_state_dict(read(best)["model"])
    sampling = Sampling(train_cfg.sample_tokens, train_cfg.sample_temperature,
                        train_cfg.sample_top_k, train_cfg.seed)
    with eval_mode(model):
        outs = generate(model, run.prompts, sampling, run.data.pad_id)
    text = "".join(f"--- prompt {p!r} ---\n{p}{run.data.decode(o)}\n\n"
                   for p, o in zip(train_cfg.sample_prompts, outs))
    (run_dir / "samples.txt").write_text(text)
