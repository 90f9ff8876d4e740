"""scripts/plot_runs.py as a command: it prints the report it writes, its exit status is main's
(2 with the reason on stderr), and importing it imports no torch. What the tables and figures
hold, and each way the options can be wrong, is tested in process, in tests/report/."""

import subprocess
import sys

import pytest
from conftest import ROOT, interval, make_run, table_row


def run_script(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/plot_runs.py", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_report_imports_no_torch():
    """The report runs where torch is not installed, and starts in a fraction of the time."""
    proc = subprocess.run([sys.executable, "-c",
                           "import scripts.plot_runs, sys; print('torch' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.slow
def test_the_command_prints_its_report_and_exits_2_without_runs(tmp_path):
    sweep = tmp_path / "sweep"
    for seed in (1, 2):
        make_run(sweep, ["scaling=dk", f"trainer.seed={seed}"], [4.0, 2.0 + 0.01 * seed],
                 full=2.0 + 0.01 * seed)
    out = tmp_path / "out"
    proc = run_script(sweep, "--out", out)
    assert proc.returncode == 0, proc.stderr
    text = (out / "results.md").read_text()
    assert text in proc.stdout
    assert table_row(text, "scaling=dk")[1:3] == ["2", f"{interval([2.01, 2.02])} (n=2)"]
    assert (out / "loss_curves.png").stat().st_size > 0
    (tmp_path / "empty").mkdir()
    proc = run_script(tmp_path / "empty", "--out", out)
    assert proc.returncode == 2 and "no run" in proc.stderr
