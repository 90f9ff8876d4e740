"""Which layer each module is in (LAYERS, the one definition; docs/training.md, "Layers", shows
it), and the layers point one way.

The import graph is read from the source with ast, function-level imports included:
- no cycle anywhere in model/, data/, trainer/, train.py and scripts/;
- a core module imports no option and no infrastructure at module level;
- the core loads an option only through the seams listed in SEAMS (an import inside the function
  that decides, when a config names the option), and the infrastructure only from train.py's
  entry functions;
- an option never imports the infrastructure.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "data", "trainer", "scripts")
DOC = ROOT / "docs" / "training.md"

# Every module of model/, data/, trainer/ and train.py (package __init__ files hold a docstring
# only; scripts/ are programs that use the layers, in none). core: what `python train.py` runs
# with the default config, the token cache's build path included; option: loaded only when a
# config names it, at one of the SEAMS below; infrastructure: sweeps under Hydra's launchers,
# loaded only by train.py's entry (ENTRY_SEAMS).
LAYERS = {
    "model.config": "core", "model.attention": "core", "model.gpt": "core",
    "model.errors": "core",
    "model.diagnostics": "option", "model.rope": "option", "model.length": "option",
    "model.mup": "option", "model.cpu_autocast": "option", "model.generate": "option",
    "data.config": "core", "data.sources": "core", "data.tokenizer": "core", "data.cache": "core",
    "data.prepare": "core", "data.batching": "core", "data.build_cache": "core",
    "data.char": "core", "data.shakespeare": "core", "data.documents": "core",
    "data.text": "option", "data.hub": "option", "data.bpe": "option", "data.padded": "option",
    "data.recall": "option",
    "train": "core", "trainer.schema": "core", "trainer.build": "core", "trainer.step": "core",
    "trainer.evaluate": "core", "trainer.checkpoint": "core", "trainer.files": "core",
    "trainer.run_dir": "core", "trainer.job": "core",
    "trainer.resume": "option", "trainer.overrides": "option", "trainer.loggers": "option",
    "trainer.z_loss": "option", "trainer.qk_clip": "option", "trainer.qk_lr_mult": "option",
    "trainer.muon": "option",
    "trainer.long_eval": "option", "trainer.checkpoint_read": "option", "trainer.exits": "option",
    "trainer.distributed": "option", "trainer.diagnose": "option",
    "trainer.samples": "option",
    "trainer.launch": "infrastructure",
}
OPTIONS = {m for m, layer in LAYERS.items() if layer == "option"}
INFRASTRUCTURE = {m for m, layer in LAYERS.items() if layer == "infrastructure"}
# (importing module, function, imported module): every place the core loads an option
SEAMS = {
    ("trainer.build", "build", "data.recall"),
    ("trainer.build", "step_hooks", "trainer.qk_clip"),
    ("trainer.build", "step_hooks", "trainer.z_loss"),
    ("trainer.build", "step_hooks", "trainer.diagnose"),
    ("trainer.evaluate", "evaluate", "trainer.diagnose"),
    ("trainer.build", "attention_class", "model.cpu_autocast"),
    ("trainer.build", "make_optimizer", "model.mup"),
    ("trainer.build", "make_optimizer", "trainer.qk_lr_mult"),
    ("trainer.build", "make_optimizer", "trainer.muon"),
    ("model.gpt", "__init__", "model.mup"),
    ("model.attention", "__init__", "model.rope"),
    ("model.attention", "__init__", "model.length"),
    ("data.prepare", "open_source", "data.hub"),
    ("data.prepare", "open_source", "data.text"),
    ("data.build_cache", "build_tokenizer", "data.bpe"),
    ("data.build_cache", "write_cache", "data.bpe"),
    ("data.prepare", "batcher", "data.padded"),
    ("trainer.run_dir", "__init__", "trainer.loggers"),
    ("trainer.job", "resume_commands", "trainer.resume"),
    ("train", "train", "trainer.resume"),
    ("train", "hydra_main", "trainer.loggers"),
    ("train", "main", "trainer.overrides"),
    ("train", "main", "trainer.distributed"),
    ("train", "hydra_main", "trainer.exits"),
    ("trainer.job", "join_processes", "trainer.distributed"),
    ("trainer.job", "leave_processes", "trainer.distributed"),
    ("train", "train", "trainer.long_eval"),
    ("train", "finish", "trainer.samples"),
}
ENTRY_SEAMS = {("train", "hydra_main", "trainer.launch")}   # the infrastructure, for sweep jobs


def modules() -> dict[str, Path]:
    found = {"train": ROOT / "train.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: set[str]) -> list[tuple[str, str | None]]:
    """(imported project module, enclosing function or None at module level) for every import
    in the file; `from package import module` counts as importing the module."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else "TYPE_CHECKING" if is_type_checking(child) else function
            if isinstance(child, ast.Import):
                found.extend((a.name, function) for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    target = full if full in known else child.module
                    if target in known:
                        found.append((target, function))
            visit(child, inner)

    visit(tree, None)
    return found


def is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:`: imports for annotations only, never run (a scope of their own)."""
    return isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"


def graph() -> dict[str, list[tuple[str, str | None]]]:
    known = modules()
    return {name: imports(path, set(known)) for name, path in known.items()}


def core_modules() -> set[str]:
    return {m for m, layer in LAYERS.items() if layer == "core"}


# The lines of the project's files (docstrings, comments and blank lines included) that a default
# run loads in float32 (on a CPU with AMX tiles auto is bf16 and adds the CPU autocast route), as
# last counted, and the bounds HEADROOM above them: room for a new scale or normaliser (a row of
# SCALES or NORMALISERS, a branch in the attention) without touching this passage. A change that
# loads more records its count here on purpose, in review; so does one that loads HEADROOM fewer.
# The fast test below counts the module-level import closure of train.py (and of the cache's
# build path); tests/e2e/test_default_run.py counts what two fresh processes load.
DEFAULT_RUN_LINES = 2538   # a run on a cached corpus: every run after the first
FIRST_RUN_LINES = 3096     # the first run, which also builds the token cache
HEADROOM = 25
MAX_DEFAULT_RUN_LINES = DEFAULT_RUN_LINES + HEADROOM
MAX_FIRST_RUN_LINES = FIRST_RUN_LINES + HEADROOM
# what a cache miss imports besides (in data.prepare.prepare and ShakespeareSource.corpus)
BUILD_ENTRIES = ("data.build_cache", "data.shakespeare")


def default_run_modules(first_run: bool = False) -> set[str]:
    """train.py and every project module it imports at module level, transitively, with their
    packages: what a default run on a cached corpus loads (function-level imports are the seams
    a config opens); `first_run`: with the cache's build path."""
    found, todo, g = set(), ["train", *(BUILD_ENTRIES if first_run else ())], graph()
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += [target for target, function in g[name] if function is None]
    return found | {m.rpartition(".")[0] for m in found if "." in m}


def test_a_default_run_loads_its_count_within_the_headroom():
    files = modules()
    for first_run, count in ((False, DEFAULT_RUN_LINES), (True, FIRST_RUN_LINES)):
        loaded = default_run_modules(first_run)
        lines = {m: len(files[m].read_text().splitlines()) for m in loaded}
        assert not loaded & (OPTIONS | INFRASTRUCTURE)
        assert sum(lines.values()) <= count + HEADROOM, sorted(lines.items())
        assert sum(lines.values()) > count - HEADROOM, "the count is stale: record it"


def test_every_module_has_one_layer():
    """A new module of model/, data/ or trainer/ fails here until LAYERS places it; a package's
    __init__ stays out of the table by importing nothing."""
    known = {m for m in modules() if not m.startswith("scripts")}
    packages = {m for m in known if m in PACKAGES}
    assert set(LAYERS) == known - packages
    assert set(LAYERS.values()) == {"core", "option", "infrastructure"}
    for package in packages:
        assert graph()[package] == [], f"{package}/__init__.py imports"


def doc_layers(text: str) -> dict[str, str]:
    """{module: layer} of the table in docs/training.md's "Layers" section."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w/]+)\.py` \| (\w+) \|", section, re.MULTILINE)
    return {path.replace("/", "."): layer for path, layer in rows}


def test_the_docs_layers_table_is_this_table():
    assert doc_layers(DOC.read_text()) == LAYERS


def test_the_docs_check_finds_a_missing_row_and_a_wrong_layer():
    table = "".join(f"| `{m.replace('.', '/')}.py` | {layer} | what |\n"
                    for m, layer in LAYERS.items())
    text = f"# Doc\n\n## Layers\n\n| module | layer | what |\n|---|---|---|\n{table}\n## Next\n"
    assert doc_layers(text) == LAYERS
    assert doc_layers(text.replace("| `model/rope.py` | option |", "| `model/rope.py` | core |")) \
        != LAYERS
    assert "model.rope" not in doc_layers(text.replace("| `model/rope.py` |", "| rope |"))


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of `edges` meets (each as the modules along it)."""
    state: dict[str, int] = {}   # 1 on the current path, 2 done
    cycles = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])
    return cycles


def edges() -> dict[str, set[str]]:
    return {m: {target for target, _ in targets} for m, targets in graph().items()}


def test_no_import_cycle_function_level_imports_included():
    assert find_cycles(edges()) == []


def test_the_core_imports_options_only_through_the_seams_and_no_infrastructure():
    core, found = core_modules(), set()
    for module, targets in graph().items():
        if module not in core:
            continue
        for target, function in targets:
            if target in OPTIONS | INFRASTRUCTURE:
                assert function is not None, f"{module} imports {target} at module level"
                found.add((module, function, target))
    assert found == SEAMS | ENTRY_SEAMS


def test_options_do_not_import_the_infrastructure():
    for module, targets in graph().items():
        if module in OPTIONS:
            assert not {t for t, _ in targets} & INFRASTRUCTURE, module


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function(tmp_path, monkeypatch):
    """The check above can fail: two files importing each other, one inside a function."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a.py").write_text("from model import b\n")
    (tmp_path / "model" / "b.py").write_text("def f():\n    from model.a import x\n")
    (tmp_path / "train.py").write_text("")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert find_cycles(edges()) == [["model.a", "model.b", "model.a"]]


def wide_functions(path: Path) -> list[tuple[str, bool]]:
    """(name, whether it has a **kwargs) of each function of `path` that takes more than 6
    parameters (self and cls aside) or a **kwargs."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                     if a.arg not in ("self", "cls")]
            if len(names) > 6 or args.kwarg:
                found.append((node.name, len(names) > 6))
    return found


def test_no_function_takes_more_than_six_parameters_or_a_keyword_splat():
    """Pass a function what it uses: at most 6 parameters (self aside), and no **kwargs, except
    the Hydra callback methods, whose signature Hydra's Callback class fixes."""
    found = [f"{name}.{function}" for name, path in modules().items()
             for function, _ in wide_functions(path)
             if not (name == "trainer.launch" and function.startswith("on_"))]
    assert found == []


# The functions a student reads first, and their most lines (signature and docstring included):
# one optimizer step in the length of nanoGPT's, and the entry points free of process plumbing.
SHORT = {("trainer.step", "train_step"): 25, ("train", "hydra_main"): 30, ("train", "main"): 30}


def test_the_step_and_the_entry_points_stay_short():
    found = {}
    for (module, function), most in SHORT.items():
        tree = ast.parse(modules()[module].read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
        start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        found[function] = (node.end_lineno - start + 1, most)
    assert {f: n for f, (n, most) in found.items() if n > most} == {}, found


TESTS = ROOT / "tests"
CONFTEST = TESTS / "conftest.py"
# conftest's stand-ins for a library's function keep that function's signature
STAND_INS = {"unrendered_savefig"}   # Figure.savefig(fname, *, transparent=None, **kwargs)


def test_no_test_helper_takes_more_than_six_parameters():
    """The same rule for the test suite's helpers (tests/report/ aside): at most 6 parameters,
    and in the shared ones (conftest.py) no **kwargs; the rarely set knobs of a fake run travel
    in one frozen dataclass (FakeRun, FakeRecall). A test function's parameters are fixtures and
    parametrize arguments, which pytest passes, and do not count."""
    found = [f"{path.relative_to(TESTS)}:{function}"
             for path in sorted(TESTS.rglob("*.py")) if "report" not in path.parts
             for function, wide in wide_functions(path)
             if not function.startswith("test_") and function not in STAND_INS
             and (wide or path == CONFTEST)]
    assert found == []


def run_readers(path: Path) -> list[tuple[str, set[str], bool]]:
    """(function, the fields of its `Run` parameter it reads, whether it hands the run on) of
    each function of `path` that takes a parameter annotated `Run`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for arg in node.args.args + node.args.kwonlyargs:
            if getattr(arg.annotation, "id", None) != "Run":
                continue
            fields = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                      and getattr(n.value, "id", None) == arg.arg}
            handed_on = any(getattr(a, "id", None) == arg.arg for n in ast.walk(node)
                            if isinstance(n, ast.Call)
                            for a in [*n.args, *(k.value for k in n.keywords)])
            found.append((node.name, fields, handed_on))
    return found


def test_no_function_takes_the_run_to_read_fewer_than_three_of_its_fields():
    """Pass a function the parts it uses: a function that takes the whole `Run` reads at least
    three of its fields, or hands it on to one that does."""
    readers = {f"{name}.{function}": (fields, handed_on) for name, path in modules().items()
               for function, fields, handed_on in run_readers(path)}
    assert len(readers) >= 10   # the check sees them: train.py's, checkpoint's, evaluate's ...
    assert [f for f, (fields, handed_on) in readers.items()
            if len(fields) < 3 and not handed_on] == []
