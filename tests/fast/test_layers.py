"""The import order of miles' packages (docs/design.md §6), read from every import statement of every file, module-
and function-level, and the modules that must stay torch-free, in one place."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MILES = REPO_ROOT / "miles"

# Lowest first. A package may import only packages of a lower tier; the packages of one tier never import each
# other. miles.backends is its __init__ (load_train_model) alone: each folder under it is a package of its own.
TIERS = (
    ("miles.config",),  # flags, their rules, the corrections and departures tables, the launch's validation, errors
    ("miles.utils",),  # plumbing: run errors, sample types, stop signals, the CLI wrapper, logging
    ("miles.models", "miles.tracking"),  # Hugging Face folders; metrics, wandb, plots
    ("miles.guard",),  # the runtime guard
    ("miles.rollout",),  # the engines, prompts, rewards, the embedded default
    ("miles.ranks",),  # a train role as ranks: bundles, rendezvous, data parallelism
    ("miles.backends.training_utils",),  # the train processes, the loss and its math
    ("miles.backends.torch_backend", "miles.backends.megatron_backend"),  # the two TrainModels
    ("miles.backends",),  # load_train_model: picks a backend
    ("miles.ray",),  # the Ray session, the rollout manager, the run's verbs, the preflight
    ("miles.check",),  # miles-check
    ("miles.conformance",),  # the parser against upstream's own
)
# Upstream's module paths kept for upstream's users: re-exports of a lower package's module, holding no code.
ALIASES = ("miles.utils.arguments", "miles.rollout.sglang_rollout")
HEAVY = ("torch", "transformers", "sglang", "megatron")
# Modules a process imports before it may need torch: the launch's validation (and upstream's path to it), the
# checker, the engines' actor shell and the rollout manager (their Ray processes start for every run).
TORCH_FREE = ("miles.config", "miles.utils", "miles.check", "miles.rollout.engine_actor", "miles.ray.rollout_manager")
PACKAGES = tuple(package for tier in TIERS for package in tier)


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
    """The longest package of ``TIERS`` that holds ``module`` (``miles.backends.torch_backend.models`` is the torch
    backend's, not ``miles.backends``'), or None for a module outside them."""
    holding = [package for package in PACKAGES if module == package or module.startswith(package + ".")]
    return max(holding, key=len, default=None)


def tier_of(package: str) -> int:
    return next(index for index, tier in enumerate(TIERS) if package in tier)


def violations(files: dict[str, set[str]]) -> list[str]:
    """``{module: imported miles modules}`` -> one line per import of a package that is not in a lower tier."""
    found = []
    for source, targets in sorted(files.items()):
        for target in sorted(targets):
            source_package, target_package = package_of(source), package_of(target)
            if None in (source_package, target_package) or source_package == target_package:
                continue
            if tier_of(target_package) >= tier_of(source_package):
                found.append(f"{source} imports {target}: {source_package} (tier {tier_of(source_package)}) may "
                             f"import only lower tiers, and {target_package} is tier {tier_of(target_package)}; "
                             "move the code it needs down, or the caller up (docs/design.md §6)")
    return found


def package_graph(files: dict[str, set[str]]) -> dict[str, set[str]]:
    """``{module: imported miles modules}`` -> ``{package: the other packages it imports}``."""
    graph = {package: set() for package in PACKAGES}
    for source, targets in files.items():
        for target in targets:
            if None not in (package_of(source), package_of(target)) and package_of(source) != package_of(target):
                graph[package_of(source)].add(package_of(target))
    return graph


def mutual_pairs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))


def _miles_files() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(MILES.rglob("*.py"))}


def _all_imports() -> dict[str, set[str]]:
    return {name: imported_modules(path) for name, path in _miles_files().items()}


def test_every_package_is_in_a_tier_and_every_tier_names_a_package():
    folders = [*MILES.iterdir(), *(MILES / "backends").iterdir()]
    packages = {module_name(path) for path in folders if (path / "__init__.py").exists()}
    assert packages == set(PACKAGES)


def test_no_import_goes_to_the_same_or_a_higher_tier():
    assert violations(_all_imports()) == []


def test_no_two_packages_import_each_other():
    assert mutual_pairs(package_graph(_all_imports())) == []


def test_the_scan_catches_an_upward_import_a_sideways_one_and_a_function_level_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from miles.backends.torch_backend.models import HFTrainModel\n")
    assert "miles.backends.torch_backend.models" in imported_modules(module)
    assert imported_modules(module, top_level_only=True) == set()
    assert violations({"miles.config.flags": {"miles.utils.errors"}}) == [
        "miles.config.flags imports miles.utils.errors: miles.config (tier 0) may import only lower tiers, and "
        "miles.utils is tier 1; move the code it needs down, or the caller up (docs/design.md §6)"]
    assert violations({"miles.ranks.role": {"miles.ray.cluster"}}) != []
    assert violations({"miles.backends.megatron_backend.model": {"miles.backends.torch_backend.models"}}) != []
    assert violations({"miles.backends.training_utils.train_process": {"miles.backends"}}) != []
    assert violations({"miles.utils.arguments": {"miles.config.arguments"}, "miles.backends": {
        "miles.backends.torch_backend.models", "miles.config.flags"}, "miles.ray.run": {"miles.ranks.role"}}) == []
    assert mutual_pairs(package_graph({"miles.ray.run": {"miles.ranks.role"}, "miles.ranks.role": {"miles.ray"}})) == [
        ("miles.ranks", "miles.ray")]


def test_the_aliases_hold_no_code():
    files = _miles_files()
    for alias in ALIASES:
        tree = ast.parse(files[alias].read_text())
        kinds = {type(node).__name__ for node in tree.body if not isinstance(node, ast.Expr)}
        assert kinds <= {"Import", "ImportFrom", "Assign"}, (alias, kinds)  # Assign: ``__all__``


def test_the_design_lists_every_tier_in_order_and_names_only_paths_that_exist():
    """docs/design.md §6's table is TIERS, row by row; a file it names is in its row's folder, or in the repository."""
    section = (REPO_ROOT / "docs" / "design.md").read_text().split("\n## 6. ", 1)[1].split("\n## 7. ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [tuple(module_name(REPO_ROOT / folder) for folder in re.findall(r"`(miles/[^`]*)`", row[1]))
            for row in rows] == list(TIERS)
    missing = []
    for row in rows:
        folders = [REPO_ROOT / folder for folder in re.findall(r"`(miles/[^`]*/)`", row[1])]
        for name in re.findall(r"`([\w/]+(?:\.py|\.toml|/))`", row[2]):
            if not any((folder / name).exists() for folder in folders):
                missing.append(name)
    missing += [path for path in re.findall(r"`((?:miles|tests)/[^`]+)`", section) if not (REPO_ROOT / path).exists()]
    assert missing == []


def test_no_import_cycle_among_modules():
    """Function-level imports count: a cycle through one still ties the two modules together."""
    files = _miles_files()
    graph = {name: {t for t in imported_modules(path) if t in files} - {name} for name, path in files.items()}
    cycles = [sorted(component) for component in _strongly_connected(graph) if len(component) > 1]
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
    modules = [name for name in files if (name == root or name.startswith(root + ".")) and not name.endswith("__main__")]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"], modules
