"""The package layering of docs/architecture.md holds: no import circle between files and
no import upward in the layer order (which this test reads from the doc's `layers` block).

Every import counts: module level, inside functions, under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("tts_runtime", "search", "memory", "evals")


def layer_order() -> list[str]:
    """Module prefixes top to bottom, from the ```layers block of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    return [line.split()[0].removesuffix("/").removesuffix(".py").replace("/", ".")
            for line in block.group(1).splitlines() if line.strip()]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(module, line) for each module of ours that `name` imports."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # `from package import submodule` imports the submodule
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` where c is a name
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def graph() -> dict[str, list[tuple[str, int]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer_of(module: str, order: list[str]) -> int | None:
    matches = [i for i, prefix in enumerate(order) if module == prefix or module.startswith(prefix + ".")]
    return max(matches, key=lambda i: len(order[i])) if matches else None


def is_reexport(importer: str, target: str) -> bool:
    """A package __init__ importing its own submodules (re-exports) is no circle."""
    return target.startswith(importer + ".") and modules_cache[importer].name == "__init__.py"


modules_cache = modules()



def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one file."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def test_layer_order_is_in_the_doc():
    order = layer_order()
    assert order[0] == "tts_runtime.cli" and order.index("tts_runtime.config") > order.index("tts_runtime.models")


def test_no_import_circle_between_files():
    edges = {name: {t for t, _ in targets if not is_reexport(name, t)} for name, targets in graph().items()}
    found = strongly_connected(edges)
    circles = found
    lines = set()
    for component in circles:
        members = set(component)
        for name in component:
            for target, line in graph()[name]:
                if target in members and not is_reexport(name, target):
                    lines.add(f"  {modules_cache[name].relative_to(ROOT)}:{line} imports {target}")
    assert not circles, "import circles between files:\n" + "\n".join(
        f"circle {' <-> '.join(c)}" for c in circles) + "\n" + "\n".join(sorted(lines))


def test_imports_go_only_downward():
    order = layer_order()
    upward = set()
    for name, targets in graph().items():
        here = layer_of(name, order)
        for target, line in targets:
            if here is None:
                continue  # tts_runtime/__init__.py: the public API facade, above every layer
            if target == "tts_runtime":
                upward.add(f"  {modules_cache[name].relative_to(ROOT)}:{line} imports the tts_runtime facade "
                              f"(import the module that defines the name)")
                continue
            there = layer_of(target, order)
            if there is not None and there < here:  # a module in no layer: test_every_module_has_a_layer
                upward.add(f"  {modules_cache[name].relative_to(ROOT)}:{line} imports {target} "
                              f"({order[here]} may import only {order[here]} and below, not {order[there]})")
    assert not upward, "imports against the layer order of docs/architecture.md:\n" + "\n".join(sorted(upward))


def test_every_module_has_a_layer():
    order = layer_order()
    missing = [name for name in modules_cache if name != "tts_runtime" and layer_of(name, order) is None]
    assert not missing, f"modules in no layer of docs/architecture.md: {missing}"
