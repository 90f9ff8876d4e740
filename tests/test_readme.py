"""The README as a reader meets it: at most MAX_LINES lines (the details live in docs/), every
file it links or names under docs/ exists, every section of docs/ it names is there, its scale
table has a row for every scale, and `.ci/run` runs exactly its test command."""

import re

from conftest import ROOT

from model.config import SCALINGS

README = (ROOT / "README.md").read_text()
# 200 lines of story and 25 spare, so that a new scale or normaliser adds its row to the table
# (which stays here: it is the list of what a reader can flip) without touching this cap
MAX_LINES = 200


def test_readme_is_at_most_max_lines():
    assert len(README.splitlines()) <= MAX_LINES


def test_every_file_the_readme_links_or_names_exists():
    linked = re.findall(r"\]\(([^)#\s]+)\)", README)
    named = re.findall(r"`((?:docs|configs|scripts|model|data|trainer|tests)/[\w./-]+\.\w+)`",
                       README)
    assert linked and named
    missing = [path for path in linked + named
               if not path.startswith("http") and not (ROOT / path).exists()]
    assert not missing, missing


def test_every_section_of_docs_the_readme_names_exists():
    """`docs/scaling.md`, "Adding a scale": the file has that heading (or one that begins
    "Adding a scale: ")."""
    named = re.findall(r"`(docs/[\w./-]+\.md)`, \"([^\"]+)\"", README)
    assert ("docs/scaling.md", "Adding a scale") in named
    missing = [(path, title) for path, title in named if not re.search(
        rf"^#+ {re.escape(title)}(: .*)?$", (ROOT / path).read_text(), flags=re.MULTILINE)]
    assert not missing, missing


def test_the_scale_table_has_a_row_for_every_scale():
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", README, flags=re.MULTILINE)
    assert set(SCALINGS) <= set(rows), sorted(set(SCALINGS) - set(rows))


def test_ci_runs_exactly_the_readme_test_command():
    block = README.split("Test (installs, then runs the whole suite")[1].split("```bash\n")[1]
    command = block.split("\n```")[0].strip()
    install_and_test = command.split("&& ", 2)[-1]   # after creating and activating the venv
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == install_and_test
