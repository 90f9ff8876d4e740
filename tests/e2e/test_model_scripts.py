"""scripts/scaling_stats.py and scripts/logit_step.py as command lines: they start from any
folder and parse their options (scaling_stats' report and figures are tested in process by
tests/model/test_scaling_stats.py, which calls main() with a temporary output folder;
logit_step's measurement by tests/trainer/test_logit_step.py)."""

import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "scaling_stats.py"


def test_scaling_stats_command_line(tmp_path):
    """One start, from another folder: the options are parsed, a bad one exits 2 with argparse's
    usage line and writes nothing."""
    bad = subprocess.run([sys.executable, str(SCRIPT), "--trials", "many"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.startswith("usage: scaling_stats.py [-h] [--out OUT] [--trials TRIALS]")
    assert "argument --trials: invalid int value: 'many'" in bad.stderr
    assert not list(tmp_path.iterdir())   # nothing was written


def test_logit_step_command_line(tmp_path):
    """scripts/logit_step.py from another folder: --from-csv prints the committed measurement's
    summary and trains nothing; steps out of order exit 2 with one error line, writing nothing."""
    script = ROOT / "scripts" / "logit_step.py"
    csv = ROOT / "docs" / "results" / "logit_step" / "logit_step.csv"
    shown = subprocess.run([sys.executable, str(script), "--from-csv", str(csv)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("step 1000, none: |s q.k| 90.6 ± 20 (n=3), one step moves it "
                               "0.887 ± 0.45 (n=3)")
    assert lines[-1].startswith("step 3000: none's step over sqrt_dk's, per seed: 18.6 ± 9.8 "
                                "(n=3)")
    bad = subprocess.run([sys.executable, str(script), "--at", "3000", "1000"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "--at must be ascending step counts from 0, got [3000, 1000]" in bad.stderr
    misspelt = subprocess.run([sys.executable, str(script), "trainer.max_stepz=3", "--at", "0",
                               "--out", "out"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
    assert misspelt.returncode == 2 and "Traceback" not in misspelt.stderr, misspelt.stderr
    assert misspelt.stderr.startswith("error: Could not override 'trainer.max_stepz'")
    assert not list(tmp_path.iterdir())
