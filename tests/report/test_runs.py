"""scripts/report/runs.py: which folders are runs, what a run's settings and seed are, how
runs group."""

import csv
import json
from pathlib import Path

from scripts.report.runs import (
    RunRecord,
    find_run_dirs,
    group_runs,
    label,
    load_runs,
    value_order,
)
from scripts.report.runs_csv import write_runs_csv


def run(overrides: dict, config: dict = None, variant: str = "dk") -> RunRecord:
    return RunRecord(Path("."), overrides, variant, [],
                     [{"kind": "eval", "step": 0, "val_loss": 4.0}], None, {"config": config or {}})


def test_settings_are_canonical_and_null_is_the_default():
    r = run({"optim.lr": "1e-3", "model.qk_init_std": "null"},
            {"trainer": {"seed": 7}, "model": {"d_head": 16, "bias": False}})
    assert r.setting("optim.lr") == "0.001" and r.lr == 0.001
    assert r.setting("model.qk_init_std") is None   # same as a run that never set it
    assert r.setting("model.d_head") == "16" and r.setting("model.bias") == "false"
    assert r.seed == "7"                            # from run.json when not overridden
    assert run({"trainer.seed": "2"}).seed == "2"
    assert run({}).setting("model.d_head") is None


def test_groups_are_the_varying_keys_minus_the_seed_in_value_order():
    runs = [run({"scaling": v, "model.d_head": d, "trainer.seed": s}, variant=v)
            for v in ("none", "sqrt_dk") for d in ("256", "16") for s in ("1", "2")]
    runs.append(run({"scaling": "none", "model.d_head": "16", "trainer.seed": "1",
                     "trainer.max_steps": "10"}, variant="none"))   # same everywhere but here
    groups = group_runs(runs)
    assert [label(k) for k in groups] == [
        "scaling=sqrt_dk, model.d_head=16, trainer.max_steps=default",
        "scaling=sqrt_dk, model.d_head=256, trainer.max_steps=default",
        "scaling=none, model.d_head=16, trainer.max_steps=default",
        "scaling=none, model.d_head=16, trainer.max_steps=10",
        "scaling=none, model.d_head=256, trainer.max_steps=default"]
    assert [len(g) for g in groups.values()] == [2, 2, 2, 1, 2]
    assert label((("model.d_head", "16"), ("optim.lr", None)), short=True) == (
        "d_head=16, lr=default")
    assert sorted(["0.1", None, "abc", "16"], key=value_order) == [None, "0.1", "16", "abc"]

def test_run_folders_are_found_without_entering_them(tmp_path):
    sweep = tmp_path / "sweep"
    for name in ("scaling=dk,trainer.seed=1", "scaling=dk,trainer.seed=2"):
        job = sweep / name
        (job / "checkpoints").mkdir(parents=True)
        (job / "checkpoints" / "metrics.jsonl").write_text("")   # inside a run: not a run
        (job / "metrics.jsonl").write_text(json.dumps(
            {"kind": "eval", "step": 0, "val_loss": 4.0}) + "\n")
        (job / "run.json").write_text(json.dumps({"overrides": name.split(",")}))
    (sweep / ".hidden" / "x").mkdir(parents=True)
    (sweep / ".hidden" / "x" / "run.json").write_text("{}")
    assert find_run_dirs(sweep) == sorted(sweep.glob("scaling=*"))
    runs, skipped = load_runs([sweep])
    assert [r.seed for r in runs] == ["1", "2"] and all(r.partial for r in runs)
    assert skipped == []


def test_a_normaliser_is_one_setting_however_set_and_labelled_by_its_name(tmp_path):
    """normaliser=sink (the group) and scaling.normaliser=softmax1 (the key) are one setting,
    scaling.normaliser, a runs.csv column; a run that set neither reads its run.json's. label
    writes a normaliser by its name: "scaling=sqrt_dk, sink", a panel "sink"."""
    sweep = tmp_path / "sweep"
    for name, scaling, normaliser in (
            ("scaling=sqrt_dk,normaliser=sink,trainer.seed=1", "sqrt_dk", "sink"),
            ("scaling=sqrt_dk,scaling.normaliser=softmax1,trainer.seed=1", "sqrt_dk", "softmax1"),
            ("scaling=none,trainer.seed=1", "none", "softmax")):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "metrics.jsonl").write_text(json.dumps(
            {"kind": "eval", "step": 0, "val_loss": 4.0}) + "\n")
        (sweep / name / "run.json").write_text(json.dumps({"overrides": name.split(","), "config": {
            "scaling": {"name": scaling, "normaliser": normaliser}}}))
    runs, _ = load_runs([sweep])
    assert [label(k) for k in group_runs(runs)] == [
        "scaling=sqrt_dk, sink", "scaling=sqrt_dk, softmax1", "scaling=none, softmax"]
    assert label((("scaling.normaliser", "sink"), ("model.d_head", "16")), short=True) == (
        "sink, d_head=16")
    assert label((("scaling.normaliser", None),)) == "scaling.normaliser=default"
    write_runs_csv(runs, tmp_path / "runs.csv", "sampled", None)
    rows = list(csv.DictReader((tmp_path / "runs.csv").open(newline="")))
    assert sorted((r["scaling"], r["scaling.normaliser"]) for r in rows) == [
        ("none", "softmax"), ("sqrt_dk", "sink"), ("sqrt_dk", "softmax1")]
    assert "normaliser" not in rows[0]
