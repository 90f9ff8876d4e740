"""configs/experiment/*.yaml end to end: a shrunken version of each preset (a few jobs of two
steps on a tiny corpus, or on data=recall's generated task) runs as its header's command line
does, and scripts/plot_runs.py reports on it. What each preset composes to is tested in
tests/trainer/test_experiments.py.

The four sweeps run in one process (conftest.run_scripts: each as `python train.py ...` runs
it; a process start costs more than a shrunken sweep), the reports in this one, their figures
built but not rendered (the report's own tests render them)."""

import json
import math
from pathlib import Path

import pytest
from conftest import report_in_process, run_scripts, write_corpus

pytestmark = pytest.mark.slow

SHRUNKEN = {   # two grid points each, sized for the tiny corpus
    "scaling_ablation": ["scaling=none,uniform", "model.n_head=2", "optim.lr=1e-3",
                         "trainer.seed=1"],
    # two seeds: the report reads each seed's loss at the LR chosen on the other seed
    "scaling_ablation_select": ["scaling=none", "optim.lr=1e-3,3e-2", "model.d_head=8",
                                "trainer.seed=1,2"],
}
# data=recall: 2 steps each of 8 sequences, a small validation set
SMALL = ["trainer.max_steps=2", "trainer.eval_every=1", "trainer.eval_iters=1",
         "trainer.log_every=1", "trainer.ckpt_every=2", "trainer.device=cpu",
         "optim.warmup_steps=1", "trainer.batch_size=8", "data.val_sequences=16"]
# Stage 1 at two LRs and the preset's two seeds, of the scale stage 2 runs; stage 2 read at the
# LR stage 1 chose (both LRs run), over head width x q, k init. The command-line overrides
# replace the presets' sweeps, as the headers' commands do.
RECALL = {"select": ["experiment=recall_scaling_select", "scaling=none", "optim.lr=1e-3,3e-2",
                     "model.d_head=8", *SMALL],
          "report": ["experiment=recall_scaling", "scaling=none", "optim.lr=1e-3,3e-2",
                     "model.d_head=8,16", "trainer.seed=3", *SMALL]}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, Path]:
    """Every shrunken preset's sweep folder, by name, after its command line ran."""
    folder = tmp_path_factory.mktemp("presets")
    corpus = write_corpus(folder / "corpus")
    tiny = ["data=text", f"data.train_files=[{corpus}/train.txt]",
            f"data.val_files=[{corpus}/val.txt]", f"data.cache_dir={folder}/cache",
            "model.n_layer=1", "model.d_model=32", "model.block_size=16",
            "trainer.batch_size=4", "trainer.max_steps=2", "trainer.eval_every=1",
            "trainer.eval_iters=1", "trainer.log_every=1", "trainer.ckpt_every=2",
            "trainer.sample_tokens=4", "trainer.sample_prompts=[the]", "trainer.device=cpu",
            "optim.warmup_steps=1"]
    commands = {name: [f"experiment={name}", *overrides, *tiny]
                for name, overrides in SHRUNKEN.items()}
    commands.update({f"recall {stage}": args for stage, args in RECALL.items()})
    runs = [("train.py", [*args, f"hydra.sweep.dir={folder / name.replace(' ', '_')}"], [])
            for name, args in commands.items()]
    for name, proc in zip(commands, run_scripts(runs)):
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
    return {name: folder / name.replace(" ", "_") for name in commands}


@pytest.mark.parametrize("name", list(SHRUNKEN))
def test_shrunken_preset_runs_end_to_end_and_reports(name, sweeps, tmp_path,
                                                     unrendered_figures):
    sweep = sweeps[name]
    runs = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert len(runs) == math.prod(o.count(",") + 1 for o in SHRUNKEN[name])
    out = tmp_path / "report"
    assert report_in_process(sweep, "--out", out) == 0
    table = (out / "results.md").read_text()
    has_full = all("final_val_loss_full" in json.loads((r / "summary.json").read_text())
                   for r in runs)
    if name == "scaling_ablation_select" and not has_full:   # no best LR to draw the curves at
        assert "curves not drawn" in table.split("## Notes")[1]
    else:
        assert (out / "loss_curves.png").stat().st_size > 0
    varied = [o.split("=")[0] for o in SHRUNKEN[name] if "," in o]
    for run in runs if "trainer.seed" not in varied else []:
        # one seed: one row per run, holding its whole-split loss or saying it is missing
        summary = json.loads((run / "summary.json").read_text())
        swept = [p for p in run.name.split(",") if p.split("=")[0] in varied]
        rows = [r for r in table.splitlines() if r.startswith("| scaling=")
                and all(p.split("=")[0] in r for p in swept)]
        full = summary.get("final_val_loss_full")
        want = (f"| {full:.4f} (n=1) |" if full is not None
                else "| missing: 1 of 1 runs lack final_val_loss_full |")
        # a 2-step run ends above the corpus's unigram level: failed, listed, left out of means
        failed = table.split("## Failed runs")[1] if "## Failed runs" in table else ""
        assert any(want in r for r in rows) or run.name in failed, (run.name, table)
    if name == "scaling_ablation_select":
        assert (out / "lr_transfer.png").stat().st_size > 0
        lr_rows = [r for r in table.split("## Learning rate")[1].splitlines()
                   if r.startswith("| scaling=none | 2 |")]   # the variant over its 2 LRs
        assert len(lr_rows) == 1, table


def test_shrunken_recall_stages_run_end_to_end_and_report(sweeps, tmp_path, unrendered_figures):
    """Stage 1 (the LR selection) and stage 2 (the report at the LR stage 1 chose)."""
    stage1, stage2 = sweeps["recall select"], sweeps["recall report"]
    assert len(list(stage1.glob("*/summary.json"))) == 2 * 2   # LR x seed
    runs = list(stage2.glob("*/summary.json"))
    assert len(runs) == 2 * 2 * 2   # LR x d_head x init
    assert all("final_val_accuracy" in json.loads(r.read_text()) for r in runs)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    assert report_in_process(stage1, "--out", out1) == 0
    assert report_in_process(stage2, "--out", out2, "--select-from", out1 / "runs.csv",
                             "--pair", "model.qk_init_std=0.02", "--heads-seed", "3") == 0
    for out in (out1, out2):
        text = (out / "results.md").read_text()
        assert "## Recall accuracy" in text and "## Learning rate" in text
        assert "no reference levels: data=recall generates its sequences" in text
        assert "steps_to_90" in (out / "runs.csv").read_text().splitlines()[0]
    text = (out2 / "results.md").read_text()
    assert "chosen on the runs of" in text
    assert "against `model.qk_init_std=0.02`" in text
    assert (out2 / "accuracy_curves.png").stat().st_size > 0
    assert len(list(out2.glob("heads_*.png"))) == 2 * 2   # d_head x init, at the chosen LR
