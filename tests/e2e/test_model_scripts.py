"""scripts/scaling_stats.py as a command line: it starts from any folder and parses its options
(its report and figures are tested in process by tests/model/test_scaling_stats.py, which calls
main() with a temporary output folder)."""

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
