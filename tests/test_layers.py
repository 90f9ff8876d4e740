"""The layers point one way (README, "Reading the code"; docs/training.md, "Layers").

The import graph is read from the source with ast, function-level imports included:
- no cycle anywhere in model/, data/, trainer/, train.py and scripts/;
- a core module imports no option and no infrastructure at module level;
- the core loads an option only through the seams listed in SEAMS (an import inside the function
  that decides, when a config names the option), and the infrastructure only from train.py's
  entry functions;
- an option never imports the infrastructure.
"""

import ast
from pathlib import Path

from conftest import INFRASTRUCTURE, OPTIONS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "data", "trainer", "scripts")
# (importing module, function, imported module): every place the core loads an option
SEAMS = {
    ("trainer.build", "build", "data.recall"),
    ("trainer.build", "step_hooks", "trainer.qk_clip"),
    ("trainer.build", "step_hooks", "trainer.z_loss"),
    ("trainer.build", "attention_class", "model.cpu_autocast"),
    ("trainer.build", "make_optimizer", "model.mup"),
    ("trainer.build", "make_optimizer", "trainer.qk_lr_mult"),
    ("trainer.checkpoint", "read", "trainer.checkpoint_v1"),
    ("model.gpt", "__init__", "model.mup"),
    ("model.attention", "__init__", "model.rope"),
    ("model.attention", "__init__", "model.length"),
    ("data.prepare", "open_source", "data.hub"),
    ("data.prepare", "open_source", "data.text"),
    ("data.build_cache", "build_tokenizer", "data.bpe"),
    ("data.build_cache", "build", "data.bpe"),
    ("data.prepare", "batcher", "data.padded"),
    ("trainer.run_dir", "__init__", "trainer.loggers"),
    ("trainer.job", "resume_commands", "trainer.resume"),
    ("train", "train", "trainer.resume"),
    ("train", "hydra_main", "trainer.loggers"),
    ("train", "main", "trainer.overrides"),
    ("train", "train", "trainer.long_eval"),
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
                else function
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


def graph() -> dict[str, list[tuple[str, str | None]]]:
    known = modules()
    return {name: imports(path, set(known)) for name, path in known.items()}


def core_modules() -> set[str]:
    return {m for m in modules() if not m.startswith("scripts")} - OPTIONS - INFRASTRUCTURE


def test_the_layer_lists_name_real_modules():
    known = set(modules())
    assert OPTIONS <= known and INFRASTRUCTURE <= known
    assert {"model.attention", "data.batching", "trainer.step", "train"} <= core_modules()


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


def test_no_function_takes_more_than_six_parameters_or_a_keyword_splat():
    """Pass a function what it uses: at most 6 parameters (self aside), and no **kwargs, except
    the Hydra callback methods, whose signature Hydra's Callback class fixes."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                         if a.arg not in ("self", "cls")]
                callback = name == "trainer.launch" and node.name.startswith("on_")
                if len(names) > 6 or (args.kwarg and not callback):
                    found.append(f"{name}.{node.name}")
    assert found == []
