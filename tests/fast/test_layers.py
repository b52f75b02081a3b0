"""The import layers (docs/design.md §6): which package of miles may import which, read from every file's imports
(function-level ones included), and the modules that must stay torch-free, in one place."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MILES = REPO_ROOT / "miles"

# Lowest first: a package may import its own layer and the layers below it, never one above.
LAYERS = (
    ("plumbing", ("miles.utils",)),  # errors, types, signals, the CLI wrapper, logging
    ("configuration", ("miles.config",)),  # flags, their rules, the corrections table, the launch's validation
    ("records and models", ("miles.models", "miles.tracking")),  # Hugging Face folders; metrics, wandb, plots
    ("runtime", ("miles.backends", "miles.guard", "miles.ranks", "miles.rollout", "miles.ray")),
    ("tools", ("miles.check", "miles.conformance")),  # miles-check, the conformance report
)
# Upstream's (or a former) module path kept as a re-export of a higher layer's module: they hold no code.
ALIASES = {"miles.utils.arguments": "miles.config.arguments", "miles.utils.check": "miles.check",
           "miles.utils.check.__main__": "miles.check.cli", "miles.utils.plot": "miles.tracking.plot"}
# Rules that live beside their subject, which configuration calls: torch-free leaves importing only plumbing.
CONFIG_LEAVES = ("miles.config.lr_schedule", "miles.config.rank_layout", "miles.config.sglang_words",
                 "miles.config.departures", "miles.config.architecture")
# Within the runtime layer: a backend never imports its sibling; the engines never import the trainers.
FORBIDDEN = {
    "miles.backends.torch_backend": ("miles.backends.megatron_backend",),
    "miles.backends.megatron_backend": ("miles.backends.torch_backend",),
    "miles.rollout": ("miles.backends", "miles.ranks", "miles.ray"),
}
HEAVY = ("torch", "transformers", "sglang", "megatron")
# Modules a process imports before it may need torch: the launch's validation (and upstream's path to it), the
# checker, the engines' actor shell and the rollout manager (their Ray processes start for every run).
TORCH_FREE = ("miles.config", "miles.utils", "miles.check", "miles.rollout.engine_actor", "miles.ray.rollout_manager")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported_modules(path: Path, top_level_only: bool = False) -> set[str]:
    """Every miles module a file imports (``from a import b`` counts ``a`` and ``a.b``); function-level imports
    too unless ``top_level_only``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = ast.walk(tree) if not top_level_only else _top_level(tree.body)
    modules = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {module for module in modules if module.startswith("miles.")}


def _top_level(body):
    """The statements that run at import: the module's body and the blocks of its ifs and trys, not functions."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                          *[handler.body for handler in getattr(node, "handlers", [])]):
                yield from _top_level(block)


def package_of(module: str) -> str | None:
    return next((package for _, packages in LAYERS for package in packages
                 if module == package or module.startswith(package + ".")), None)


def layer_of(module: str) -> int | None:
    package = package_of(module)
    return next((index for index, (_, packages) in enumerate(LAYERS) if package in packages), None)


def violations(files: dict[str, set[str]]) -> list[str]:
    """``{module: imported miles modules}`` -> one line per import that goes up a layer or breaks a rule."""
    found = []
    for source, targets in sorted(files.items()):
        for target in sorted(targets):
            for prefix, forbidden in FORBIDDEN.items():
                if source.startswith(prefix) and target.startswith(forbidden):
                    found.append(f"{source} imports {target}: {prefix} may not import {', '.join(forbidden)}")
            if package_of(target) is None or package_of(target) == package_of(source):
                continue
            alias = ALIASES.get(source)
            allowed_up = ((alias is not None and (target == alias or target.startswith(alias + ".")))
                          or (package_of(source) == "miles.config" and target.startswith(CONFIG_LEAVES)))
            if layer_of(target) > layer_of(source) and not allowed_up:
                found.append(f"{source} imports {target}: {LAYERS[layer_of(source)][0]} may not import "
                             f"{LAYERS[layer_of(target)][0]}")
    return found


def _miles_files() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(MILES.rglob("*.py"))}


def test_every_package_is_in_a_layer():
    packages = {module_name(path) for path in MILES.iterdir() if (path / "__init__.py").exists()}
    assert {p for p in packages if package_of(p) is None} == set()


def test_no_import_goes_up_a_layer_or_breaks_a_rule():
    files = {name: imported_modules(path) for name, path in _miles_files().items()}
    assert violations(files) == []


def test_the_scan_catches_an_upward_import_and_a_function_level_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from miles.backends.torch_backend.models import HFTrainModel\n")
    assert "miles.backends.torch_backend.models" in imported_modules(module)
    assert imported_modules(module, top_level_only=True) == set()
    assert violations({"miles.config.flags": {"miles.ray.run"}}) == [
        "miles.config.flags imports miles.ray.run: configuration may not import runtime"]
    assert violations({"miles.backends.megatron_backend.model": {"miles.backends.torch_backend.models"}}) != []
    assert violations({"miles.config.arguments": {"miles.config.rank_layout", "miles.utils.errors"}}) == []


def test_the_config_leaves_import_only_plumbing():
    files = _miles_files()
    for leaf in CONFIG_LEAVES:
        assert all(package_of(target) == "miles.utils" for target in imported_modules(files[leaf])), leaf


def test_the_aliases_hold_no_code():
    for alias in ALIASES:
        path = MILES.joinpath(*alias.split(".")[1:])
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        tree = ast.parse(path.read_text())
        kinds = {type(node).__name__ for node in tree.body if not isinstance(node, ast.Expr)}
        assert kinds <= {"Import", "ImportFrom", "If"}, (alias, kinds)  # If: the __main__ guard


def test_no_import_cycle_among_modules():
    """Module-level imports only: a function-level import runs after every module has loaded."""
    files = _miles_files()
    graph = {name: {t for t in imported_modules(path, top_level_only=True) if t in files} - {name}
             for name, path in files.items()}
    cycles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def test_the_cycle_finder_finds_a_cycle():
    assert sorted(map(sorted, _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}))) == [
        ["a", "b", "c"], ["d"]]


@pytest.mark.parametrize("root", TORCH_FREE)
def test_the_torch_free_modules_import_nothing_heavy(root):
    files = _miles_files()
    modules = [name for name in files if (name == root or name.startswith(root + "."))
               and not name.endswith("__main__") and name not in ALIASES]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"], modules
