"""The README as a reader meets it: at most 200 lines (the details live in docs/), every file it
links or names under docs/ exists, and `.ci/run` runs exactly its test command."""

import re

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_every_file_the_readme_links_or_names_exists():
    linked = re.findall(r"\]\(([^)#\s]+)\)", README)
    named = re.findall(r"`((?:docs|configs|scripts|model|data|trainer|tests)/[\w./-]+\.\w+)`",
                       README)
    assert linked and named
    missing = [path for path in linked + named
               if not path.startswith("http") and not (ROOT / path).exists()]
    assert not missing, missing


def test_ci_runs_exactly_the_readme_test_command():
    block = README.split("Test (installs, then runs the whole suite")[1].split("```bash\n")[1]
    command = block.split("\n```")[0].strip()
    install_and_test = command.split("&& ", 2)[-1]   # after creating and activating the venv
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == install_and_test
