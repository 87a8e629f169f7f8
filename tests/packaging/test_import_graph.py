"""The house's import rules, read from the source with ``ast``: no import cycle inside any of
the project's packages (in-function imports count: a cycle hidden in a function is still one)
and no module whose name shadows the standard library."""

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "wmrl": ROOT / "wmrl",
    "wmrl_operator": ROOT / "operator" / "wmrl_operator",
    "wmrl_trainer": ROOT / "trainer" / "wmrl_trainer",
    "wmrl_bench": ROOT / "trainer" / "wmrl_bench",
    "wmrl_demo": ROOT / "trainer" / "wmrl_demo",
    "wmrl_sandbox": ROOT / "sandbox-image" / "wmrl_sandbox",
}


def modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package``."""
    base = PACKAGES[package]
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = [p for p in path.relative_to(base).with_suffix("").parts if p != "__init__"]
        found[".".join([package, *parts])] = path
    return found


def imported(module: str, path: Path) -> set[str]:
    """Every dotted name ``module`` imports, relative imports resolved, TYPE_CHECKING blocks aside."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = {id(node) for branch in ast.walk(tree)
               if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
               for node in ast.walk(branch)}
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's own modules it imports (a package's parents it lives in excluded)."""
    mods = modules(package)
    edges = {}
    for module, path in mods.items():
        targets = set()
        for name in imported(module, path):
            while name not in mods and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in mods and name != module and not module.startswith(name + "."):
                targets.add(name)
        edges[module] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_inside_a_package(package):
    assert cycles(graph(package)) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_shadows_the_standard_library(package):
    shadowing = [m for m in modules(package) if m.rsplit(".", 1)[-1] in sys.stdlib_module_names]
    assert shadowing == []


def test_no_test_folder_shadows_a_dependency():
    """pytest puts ``tests/`` on sys.path, so a folder there named like a dependency that is not
    installed (``tests/vllm`` with no vllm in the venv) is imported in its place, as a namespace
    package without a version, and breaks every library that probes for it (TRL's
    ``is_vllm_available`` raises on it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    names = {re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("-", "_") for req in requirements}
    folders = {p.name.lower() for p in (ROOT / "tests").iterdir() if p.is_dir()}
    assert "vllm" in names and "torch" in names  # the parse found the extras
    assert folders & names == set()
