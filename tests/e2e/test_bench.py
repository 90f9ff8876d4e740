"""scripts/bench.py: the --quick run writes well-formed JSON and Markdown with the expected rows,
and the measuring helpers measure what they say. Timings themselves are not checked."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from model.config import NORMALISERS, SCALINGS, SDPA_NORMALISERS, GPTConfig
from model.gpt import GPT
from scripts import bench, common

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
QUICK_SEQ_LENS = [16, 32]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `--quick` run on one thread (small tensors: a second thread only adds hand-offs)."""
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "scripts/bench.py", "--quick", "--threads", "1",
           "--json", str(out / "bench.json"), "--markdown", str(out / "bench.md")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    return result, (out / "bench.md").read_text(), proc.stdout


@pytest.mark.slow
def test_quick_run_records_the_environment(quick):
    result, _, _ = quick
    env = result["env"]
    assert env["device"] == "cpu" and env["torch_threads"] == 1
    assert env["torch"] == torch.__version__
    for key in ("python", "numpy", "cpu", "cpu_count", "loadavg_start", "loadavg_end"):
        assert env[key] not in (None, ""), key
    assert result["command"].startswith("python scripts/bench.py --quick")
    for key in ("matmul", "matmul_end"):  # the peak rate, measured before and after
        assert {m["dtype"] for m in result[key]} == {"fp32", "bf16"}
        assert all(m["flops"] > 0 for m in result[key])


@pytest.mark.slow
def test_quick_run_has_every_attention_row(quick):
    """Every scale under softmax on both paths; every other normaliser under sqrt_dk on the
    explicit path and, where SDPA computes it, on SDPA; ratios within the same T."""
    rows = quick[0]["attention"]
    keys = {(r["T"], r["impl"], r["scaling"], r["normaliser"]) for r in rows}
    scales = {(impl, s, "softmax") for impl in ("explicit", "sdpa") for s in SCALINGS}
    normalisers = {("explicit", "sqrt_dk", n) for n in NORMALISERS} | {
        ("sdpa", "sqrt_dk", n) for n in SDPA_NORMALISERS}
    assert keys == {(T, *case) for T in QUICK_SEQ_LENS for case in scales | normalisers}
    assert ("sdpa", "sqrt_dk", "sigmoid") not in normalisers and len(rows) == len(keys)
    by = {(r["T"], r["impl"], r["scaling"], r["normaliser"]): r for r in rows}
    for (T, impl, s, n), r in by.items():
        assert r["ms"] > 0 and r["peak_bytes"] > 0 and r["B"] * T == 64
        assert math.isclose(r["ms"], statistics.median(r["times_ms"]))
        assert math.isclose(r["speedup_vs_explicit"], by[T, "explicit", s, n]["ms"] / r["ms"])
        assert math.isclose(r["time_vs_sqrt_dk"], r["ms"] / by[T, impl, "sqrt_dk", n]["ms"])
        assert math.isclose(r["time_vs_softmax"], r["ms"] / by[T, impl, s, "softmax"]["ms"])
        assert math.isclose(r["memory_vs_explicit"],
                            r["peak_bytes"] / by[T, "explicit", s, n]["peak_bytes"])


@pytest.mark.slow
def test_quick_run_has_step_and_data_rows(quick):
    result = quick[0]
    steps = {(r["config"], r["precision"], r["compile"]): r for r in result["step"]}
    assert set(steps) == {("nanogpt_cpu", p, False) for p in ("fp32", "bf16")}
    cfg = bench.CONFIGS["nanogpt_cpu"]
    for r in steps.values():
        assert math.isclose(r["tokens_per_s"], cfg.batch_size * cfg.block_size / (r["ms"] / 1e3))
        assert 0 < r["mfu"] and r["n_params"] > 0 and len(r["warmup_s"]) == 1
        # a step holds at least its logits (B x T x vocab, 2 bytes or more each) at once
        assert cfg.batch_size * cfg.block_size * cfg.vocab_size * 2 <= r["peak_bytes"] < 2**30
        assert "nanogpt_ms" not in r and "speedup_vs_nanogpt" not in r  # no --nanogpt
    assert "nanogpt" not in result
    # exactly one precision is what trainer.precision=auto picks for this model
    assert sum(r["is_auto"] for r in steps.values()) == 1
    assert steps["nanogpt_cpu", "fp32", False]["speedup_vs_fp32_eager"] == 1.0
    (data,) = result["data"]
    assert data["config"] == "nanogpt_cpu" and data["fetch_ms"] > 0
    assert math.isclose(data["share_of_fastest_step"], data["fetch_ms"] / data["fastest_step_ms"])
    assert result["sync"]["measured"] is False


@pytest.mark.slow
def test_quick_run_times_muon_against_adamw(quick):
    """The default recipe's step under each optimizer (fp32 here: this CPU's auto), the ratio
    of their medians, Muon's 4 x 6 matrices updated alone by each implementation."""
    optim = quick[0]["optim"]
    assert (optim["config"], optim["precision"]) == ("nanogpt_cpu", "fp32")
    assert optim["muon"] == "Float32Muon + AdamW"
    steps = optim["steps"]
    for row in steps.values():
        assert row["ms"] > 0 and math.isclose(row["ms"], statistics.median(row["times_ms"]))
    assert math.isclose(optim["muon_over_adamw"], steps["muon"]["ms"] / steps["adamw"]["ms"])
    updates = optim["updates"]
    assert updates["matrices"] == 24 and updates["shapes"] == [[128, 128], [128, 512],
                                                                [512, 128]]
    assert len(updates["ms"]) == 4 and all(ms > 0 for ms in updates["ms"].values())
    assert optim["diagnostics_ms"] > 0


@pytest.mark.slow
def test_quick_markdown_tables_are_well_formed(quick):
    result, md, stdout = quick
    assert md.strip() in stdout
    for heading in ("## Peak matmul rate", "## Attention layer", "## Attention normalisers",
                    "## Training step", "## Data path", "## Muon against AdamW",
                    "## Host-device syncs"):
        assert heading in md
    tables = [block for block in md.split("\n\n") if block.startswith("|")]
    assert [len(t.splitlines()) - 2 for t in tables] == [
        2, 2 * len(SCALINGS), 2 * len(NORMALISERS), 2, 1, 2, 4]
    sigmoid = [line for line in tables[2].splitlines() if "| sigmoid |" in line]
    assert len(sigmoid) == 2 and all(line.split(" | ")[4] == "-" for line in sigmoid)  # no SDPA
    assert "nanoGPT ms" not in md and "vs nanoGPT" not in md  # no --nanogpt, no column
    for t in tables:
        widths = {line.count("|") for line in t.splitlines()}
        assert len(widths) == 1, t


def test_peak_memory_on_cpu_measures_what_a_call_holds_at_once():
    def one_big():
        x = torch.empty(8 * MIB, dtype=torch.uint8)
        x.fill_(1)
        del x

    def two_at_once_then_one():
        a = torch.empty(2 * MIB, dtype=torch.uint8)
        b = torch.empty(1 * MIB, dtype=torch.uint8)
        del a, b
        torch.empty(1 * MIB, dtype=torch.uint8)

    peaks = bench.peak_memory({"big": one_big, "two": two_at_once_then_one},
                              torch.device("cpu"))
    assert 8 * MIB <= peaks["big"] < 8 * MIB + 64 * 1024
    assert 3 * MIB <= peaks["two"] < 3 * MIB + 64 * 1024


@pytest.mark.parametrize("vocab_size", [65, 300, bench.CONFIGS["gpt2_small"].vocab_size])
def test_bench_corpus_has_exactly_the_requested_vocabulary(tmp_path, vocab_size):
    """Also GPT-2 small's 50,304 ids (the GPU configuration): that many distinct characters."""
    from omegaconf import OmegaConf

    from data.config import DataConfig
    from data.prepare import prepare

    n_chars = max(2_000, vocab_size + 1_000)  # every character at least once
    cfg = common.compose_config(bench.corpus(tmp_path, n_chars, vocab_size))
    data = prepare(DataConfig(**OmegaConf.to_container(cfg.data, resolve=True)))
    assert data.vocab_size == vocab_size
    assert len(data.train) > n_chars and int(data.train[:].max()) < vocab_size


def test_interleave_rotates_the_order_and_times_every_call():
    order = []
    cases = {name: (lambda name=name: order.append(name)) for name in "abc"}
    times = common.interleave(cases, rounds=3, per_round=2, device=torch.device("cpu"))
    assert order == list("aabbcc" "bbccaa" "ccaabb")
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6, "c": 6}
    assert all(t >= 0 for v in times.values() for t in v)


def test_interleave_runs_before_round_untimed_at_the_start_of_every_round():
    order = []
    cases = {name: (lambda name=name: order.append(name)) for name in "ab"}
    times = common.interleave(cases, rounds=2, per_round=1, device=torch.device("cpu"),
                             before_round=lambda: order.append("|"))
    assert order == list("|ab" "|ba")
    assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}


def test_markdown_cells():
    assert bench.cell(None) == "-"
    assert bench.cell(0.12345) == "0.123"
    assert bench.cell(12345.6) == "12,346"
    assert bench.table(["a", "b"], [[1, 2.5]]) == "| a | b |\n|---|---|\n| 1 | 2.5 |"


# ---------------------------------------------------------------- --nanogpt, on a fake checkout

# Stand-ins for nanoGPT's configurator.py and train.py with the behaviour the bench relies on:
# `--key=value` overrides of train.py's globals after the config file, data/<dataset>/meta.pkl
# and train.bin read from the working folder, one `iter N: loss X, time Y ms` line per
# iteration 0..max_iters. The times are known: 1000 ms during the warm-up iterations the bench
# must drop, then 10 + N % 4 ms. The assertions check the command the bench runs.
FAKE_CONFIGURATOR = """
import sys
from ast import literal_eval
for arg in sys.argv[1:]:
    if '=' not in arg:
        exec(open(arg).read())
    else:
        key, val = arg[2:].split('=')
        assert key in globals(), key
        try:
            val = literal_eval(val)
        except (SyntaxError, ValueError):
            pass
        assert type(val) == type(globals()[key]), key
        globals()[key] = val
"""
FAKE_CONFIG = "dataset = 'shakespeare_char'\nalways_save_checkpoint = False\nlog_interval = 10\n"
FAKE_TRAIN = """
import os, pickle
import numpy as np
out_dir, eval_interval, log_interval, eval_iters, always_save_checkpoint = 'out', 2000, 1, 200, True
dataset, batch_size, block_size, n_layer, n_head, n_embd = 'openwebtext', 12, 1024, 12, 12, 768
dropout, max_iters, lr_decay_iters, device, compile = 0.0, 600000, 600000, 'cuda', True
exec(open('configurator.py').read())
assert (device, compile, log_interval, eval_iters) == ('cpu', False, 1, 20)
assert (n_layer, n_head, n_embd, block_size, batch_size, dropout) == (4, 4, 128, 64, 12, 0.0)
assert eval_interval > max_iters and not always_save_checkpoint
assert os.environ['OMP_NUM_THREADS'] == '1', os.environ['OMP_NUM_THREADS']
data_dir = os.path.join('data', dataset)
with open(os.path.join(data_dir, 'meta.pkl'), 'rb') as f:
    vocab_size = pickle.load(f)['vocab_size']
train = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
assert vocab_size == 65 and len(train) > block_size and train.max() < vocab_size
for it in range(max_iters + 1):
    ms = 1000.0 if it < 5 else 10.0 + it % 4
    print(f"iter {it}: loss 4.1743, time {ms:.2f}ms, mfu -100.00%")
"""


def fake_nanogpt(folder: Path, train_py: str = FAKE_TRAIN) -> Path:
    for name, text in (("train.py", train_py), ("model.py", "# the model\n"),
                       ("configurator.py", FAKE_CONFIGURATOR),
                       ("config/train_shakespeare_char.py", FAKE_CONFIG)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def fake_times(iters: int) -> list[float]:
    """What one run of the fake prints after the warm-up iterations."""
    first = bench.NANOGPT_WARMUP_ITERS
    return [10.0 + it % 4 for it in range(first, first + iters)]


def nanogpt_run(tmp_path: Path, train_py: str, iters: int = 4) -> bench.NanoGPT:
    checkout = fake_nanogpt(tmp_path / "checkout", train_py)
    nanogpt = bench.NanoGPT(checkout, tmp_path / "work", iters)
    tokens = np.arange(1000) % 65
    nanogpt.write_data(tokens, tokens[:200], 65)
    return nanogpt


def test_nanogpt_runs_drop_the_warm_up_and_take_the_median(tmp_path, single_thread):
    nanogpt = nanogpt_run(tmp_path, FAKE_TRAIN)
    before = sorted(p.name for p in (tmp_path / "checkout").rglob("*"))
    nanogpt.run()
    nanogpt.run()
    assert nanogpt.times_ms == fake_times(4) * 2  # [11, 12, 13, 10] from each run
    summary = nanogpt.summary()
    assert summary["ms"] == 11.5 and summary["runs"] == 2 and summary["threads"] == 1
    assert summary["command"].startswith("python train.py config/train_shakespeare_char.py")
    assert sorted(p.name for p in (tmp_path / "checkout").rglob("*")) == before  # untouched


def test_nanogpt_ratio_is_its_median_over_ours():
    rows = [{"ms": 20.0}, {"ms": 40.0}]
    bench.compare_with_nanogpt(rows, 30.0)
    assert rows == [{"ms": 20.0, "nanogpt_ms": 30.0, "speedup_vs_nanogpt": 1.5},
                    {"ms": 40.0, "nanogpt_ms": 30.0, "speedup_vs_nanogpt": 0.75}]


def test_nanogpt_failure_shows_the_end_of_its_stderr(tmp_path, single_thread):
    failing = "import sys\nprint('boom: no such thing', file=sys.stderr)\nsys.exit(3)\n"
    with pytest.raises(bench.NanoGPTError, match="(?s)exit code 3.*boom: no such thing"):
        nanogpt_run(tmp_path, failing).run()


def test_nanogpt_log_lines_in_another_format_are_an_error(tmp_path, single_thread):
    other = FAKE_TRAIN.replace("iter {it}: loss", "step {it} loss")
    with pytest.raises(bench.NanoGPTError, match="printed 0 lines"):
        nanogpt_run(tmp_path, other).run()


def test_a_folder_that_is_not_a_nanogpt_checkout_exits_2(tmp_path, capsys):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--quick", "--parts", "step", "--nanogpt", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "is not a nanoGPT checkout" in err and "model.py, configurator.py" in err
    assert len(err.strip().splitlines()) == 1  # one paragraph


@pytest.mark.slow
def test_quick_run_with_nanogpt_reports_its_median_and_the_ratio(tmp_path, single_thread,
                                                                 capsys):
    """--nanogpt on the fake checkout: its parsed median and the ratio in JSON and Markdown.
    The bench runs in this process (the quick fixture runs its command line); the fake
    nanoGPT runs as nanoGPT does, in processes of its own."""
    checkout = fake_nanogpt(tmp_path / "checkout")
    bench.main(["--quick", "--parts", "step", "--threads", "1", "--nanogpt", str(checkout),
                "--nanogpt-iters", "4", "--json", str(tmp_path / "bench.json"),
                "--markdown", str(tmp_path / "bench.md")])
    result = json.loads((tmp_path / "bench.json").read_text())
    rounds = bench.QUICK["rounds"]
    assert result["nanogpt"]["times_ms"] == fake_times(4) * rounds
    assert result["nanogpt"]["ms"] == 11.5 and result["nanogpt"]["runs"] == rounds
    for r in result["step"]:
        assert r["nanogpt_ms"] == 11.5
        assert math.isclose(r["speedup_vs_nanogpt"], 11.5 / r["ms"])
    md = (tmp_path / "bench.md").read_text()
    (steps,) = [b for b in md.split("\n\n") if b.startswith("| config | params")]
    assert "| nanoGPT ms | vs nanoGPT |" in steps.splitlines()[0]
    assert len({line.count("|") for line in steps.splitlines()}) == 1
    assert "nanoGPT ms: median of 8 iterations" in md


def test_flops_per_token_counts_the_matmuls_and_the_attention_square():
    V, T, L, C, H = 50, 12, 2, 16, 2
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, d_model=C))
    n_matmul = L * (3 * C * C + C * C + 8 * C * C) + V * C  # projections, MLP, LM head
    assert bench.flops_per_token(model, T) == 6 * n_matmul + 12 * L * H * (C // H) * T
    assert bench.flops_per_token(model, 5) == 6 * n_matmul + 12 * L * H * (C // H) * 5


def test_bench_bounds_times_each_bound_against_the_plain_step(tiny_shared, capsys):
    """scripts/bench_bounds.py on the tiny config, one round of one step: a row per case, the
    plain case's ratio exactly 1 (timings are not checked), and QK-Clip really armed."""
    from scripts import bench_bounds
    rows = bench_bounds.main([*tiny_shared, "--rounds", "1", "--per-round", "1", "--warmup",
                              "1"])
    assert [r["case"] for r in rows] == ["plain", "qk_clip", "z_loss"]
    assert rows[0]["ratio"] == 1.0 and all(r["median_ms"] > 0 for r in rows)
    out = capsys.readouterr().out
    assert "| qk_clip | `optim.qk_clip=1` |" in out and "1 rounds x 1 steps" in out
