"""Resuming a run from its last.pt (trainer.resume=auto or a path; docs/training.md, "Resume"), and
the command that does it. A resumed run continues bit-identically: every piece of state the next
step depends on is restored, and the settings must match the checkpoint's except those that only say
how long, how often, where and how fast.
"""

import json
import random
import re
import shlex
import shutil
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from hydra.utils import to_absolute_path

from model.errors import UserError
from trainer.build import Progress, Run
from trainer.checkpoint_read import CheckpointError, read
from trainer.files import display_path
from trainer.schema import GROUPS, LoggerConfig, flat

# Settings that may differ between a checkpoint and the run resuming from it: how long to
# train, how often to look, where and how fast to compute, what to sample at the end, where the
# records are mirrored and what they add. Every other key of the config must match.
MAY_CHANGE_ON_RESUME = (
    "trainer.max_steps", "trainer.eval_every", "trainer.log_every", "trainer.ckpt_every",
    "trainer.device", "trainer.threads", "trainer.compile", "trainer.precision",
    "trainer.resume", "trainer.on_nan", "trainer.sample_prompts", "trainer.sample_tokens",
    "trainer.sample_temperature", "trainer.sample_top_k", "trainer.full_eval_tokens",
    "trainer.diagnostics", "data.cache_dir", "model.attn_impl",
    *(f"logger.{f.name}" for f in fields(LoggerConfig)))


def remove_if_unstarted(run_dir: Path) -> None:
    """Delete a run directory that holds nothing, or only a .hydra/ (the run did not start)."""
    if run_dir.resolve() != Path.cwd().resolve() and run_dir.is_dir() and {
            p.name for p in run_dir.iterdir()} <= {".hydra"}:
        shutil.rmtree(run_dir)


def hydra_quoted(value: str) -> str:
    """A Hydra override value that may hold `=` and `,` (a sweep job's folder name), quoted.
    In a quoted value Hydra reads a backslash as an escape only before a quote or the closing
    quote: those backslashes are doubled and the quotes escaped; any other stays as it is."""
    return '"' + re.sub(r'(\\*)("|$)', lambda m: m[1] * 2 + ("\\" + m[2] if m[2] else ""),
                        value) + '"'


def python_launcher(script: str, world: int) -> list[str]:
    return (["python", script] if world == 1 else
            ["torchrun", "--standalone", f"--nproc_per_node={world}", script])


def run_command(run_dir: Path, world: int, script: str, overrides: list[str]) -> str:
    """The shell command that continues the run in run_dir alone, in its own folder, with the
    `overrides` it was started with (hydra.mode=RUN: a preset's MULTIRUN would ignore
    hydra.run.dir; hydra.output_subdir=null keeps the job's .hydra/). `script`: train.py."""
    own = ("trainer.resume=", "hydra.mode=", "hydra.run.", "hydra.sweep.", "hydra.sweeper.",
           "hydra.output_subdir=", "hydra/launcher=", "hydra.launcher.")
    given = [o for o in overrides if not o.startswith(own)]
    return shlex.join([*python_launcher(script, world), *given, "trainer.resume=auto",
                       "hydra.mode=RUN", "hydra.output_subdir=null",
                       f"hydra.run.dir={hydra_quoted(display_path(run_dir))}"])


def resume_path(resume: Optional[str], run_dir: Path) -> Optional[Path]:
    """trainer.resume: null (fresh), auto (run_dir's last.pt if any), or a checkpoint path."""
    if resume == "auto":
        path = run_dir / "checkpoints" / "last.pt"
        return path if path.exists() else None
    return None if resume is None else Path(to_absolute_path(resume))


def restore(run: Run, path: Path) -> None:
    """Load every piece of state the next step depends on from a last.pt checkpoint."""
    try:
        ckpt = read(path)
    except CheckpointError as err:
        raise UserError(f"Cannot resume from {err.path} (trainer.resume="
                        f"{run.config.train_cfg.resume}): {err.problem} Resume from "
                        "checkpoints/last.pt of a run trained by this version of train.py, or "
                        "start a new run without trainer.resume.") from None
    if ckpt["version"] == 1:
        raise UserError(f"Cannot resume from {path}: it was written before W_q, W_k and W_v "
                        "became separate matrices (checkpoint format version 1), and its "
                        "optimizer state does not map onto them. Its weights still load for "
                        "sampling and evaluation (scripts/sample.py); to train, start the run "
                        "again without trainer.resume.")
    check_resumable(ckpt, run.config.resolved, run.config.model_cfg.vocab_size, path)
    compute, state = run.compute, run.state
    state.model.load_state_dict(ckpt["model"])
    state.optimizer.load_state_dict(ckpt["optimizer"])
    state.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt["scaler"]:   # empty when saved without fp16 (a disabled scaler has no state)
        state.scaler.load_state_dict(ckpt["scaler"])
    check_sampler(ckpt["sampler"], state.batcher.state_dict(), path)
    state.batcher.load_state_dict(ckpt["sampler"])
    state.progress = Progress(**{f.name: ckpt[f.name] for f in fields(Progress)})
    rngs = ckpt["rng"]   # one per process; a run resumed on another process count uses the first
    set_rng_state(rngs[compute.rank] if len(rngs) == compute.world else rngs[0], compute.device)


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what `rng_state` saved; a saved CUDA stream goes to this process's device."""
    random.setstate((state["python_version"], tuple(state["python"].tolist()),
                     state["python_gauss"]))
    has_gauss, gauss = state["numpy_gauss"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32),
                         state["numpy_pos"], has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def check_resumable(ckpt: dict, config: dict, vocab_size: int, path: Path) -> None:
    """Refuse to resume from `ckpt` into a run whose settings differ, naming the keys."""
    if "optimizer" not in ckpt:
        raise UserError(f"Cannot resume from {path}: it holds weights only (a best.pt); "
                        "resume from checkpoints/last.pt, which holds the whole training state.")
    # the vocabulary size is not a setting but follows from the data's tokenizer
    saved = {**flat(ckpt["config"]), "model.vocab_size": ckpt["model_config"]["vocab_size"]}
    now = {**flat(config), "model.vocab_size": vocab_size}
    diff = [k for k in sorted(saved.keys() | now.keys())
            if k not in MAY_CHANGE_ON_RESUME and saved.get(k) != now.get(k)
            and not (k not in saved and now.get(k) == schema_default(k))]
    if diff:
        listed = "; ".join(f"{k}: {saved_value(k, saved)}, now {now.get(k)!r}" for k in diff)
        raise UserError(f"Cannot resume from {path}: the settings differ from the checkpoint's "
                        f"({listed}). Resume with the checkpoint's settings, or start a new run "
                        f"without trainer.resume. Only {', '.join(MAY_CHANGE_ON_RESUME)} may "
                        "change on resume.")


def saved_value(key: str, saved: dict) -> str:
    """The checkpoint's `key` as check_resumable names it: its value, or, where the checkpoint
    predates the key, the schema's default that it was trained with and resumes as."""
    if key in saved:
        return f"checkpoint {saved[key]!r}"
    default = schema_default(key)
    return "the checkpoint predates the key" + (
        "" if default is MISSING else f" and resumes as {default!r}")


def check_sampler(saved: dict, mine: dict, path: Path) -> None:
    """Refuse a saved sampler state whose settings (all but the step) differ from this run's:
    the resumed run would not replay the batches of the uninterrupted one."""
    diff = [k for k in mine if k != "step" and saved.get(k) != mine[k]]
    if diff:
        raise UserError(f"Cannot resume from {path}: its sampler state differs from this run's "
                        f"in {diff} (saved { {k: saved.get(k) for k in diff} }, now "
                        f"{ {k: mine[k] for k in diff} }), so the batches would not replay. "
                        "Resume with the checkpoint's data and batch settings.")


def schema_default(key: str):
    """The schema's default of a dotted key ("optim.qk_clip" -> None), or a marker equal to no
    value where the key has none. A key that a checkpoint's config lacks was added to the
    schema after it was written; at its default it changes nothing, so the run resumes."""
    group, _, name = key.partition(".")
    cls = GROUPS.get(group)
    for f in fields(cls) if cls is not None else ():
        if f.name == name:
            return f.default if f.default is not MISSING else f.default_factory()
    return MISSING


def finished(step: int, max_steps: int, run_dir: Path, rank: int) -> bool:
    """Whether a resumed run has nothing left to do (its checkpoint is at trainer.max_steps and
    its summary.json is written, or its summary.json says it diverged); rank 0 says why. A
    checkpoint at trainer.max_steps without summary.json is a run stopped while finishing (the
    whole-split evaluation): train.py then trains no step and does the rest."""
    summary = run_dir / "summary.json"
    if step >= max_steps and summary.is_file():
        reason = (f"its checkpoint is at step {step} and trainer.max_steps={max_steps}; raise "
                  "trainer.max_steps to train it further")
    elif summary.is_file() and json.loads(summary.read_text()).get("diverged"):
        reason = ("it diverged (summary.json); start a new run, e.g. with a lower optim.lr, to "
                  "try again")
    else:
        return False
    if rank == 0:
        print(f"Nothing to do: the run in {run_dir} is finished ({reason}). Its files are left "
              "as they are.")
        remove_if_unstarted(run_dir)   # a new folder (trainer.resume=PATH) nothing was written to
    return True
