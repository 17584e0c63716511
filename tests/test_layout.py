"""The library's layout: no import circle, no file past 450 lines, a module map that names every file."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "funcnet"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the funcnet modules it imports anywhere (at module level or lazily inside a
    function). ``from funcnet import data`` depends on ``funcnet.data``, not on the package."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from .x import y, inside package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.add(full if full in modules else base)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _cycles(graph):
    found, color = [], {}

    def visit(u, stack):
        color[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if color.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in color:
                visit(v, stack)
        stack.pop()
        color[u] = 2

    for m in sorted(graph):
        if m not in color:
            visit(m, [])
    return found


def test_no_import_circle():
    graph = _import_graph()
    assert graph["funcnet.train"] >= {"funcnet.parallel.strategy", "funcnet.step"}  # the graph is read, not empty
    cycles = _cycles(graph)
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_old_circle_is_gone():
    graph = _import_graph()
    assert "funcnet.train" not in graph["funcnet.parallel"]
    assert "funcnet.train" not in graph["funcnet.parallel.fsdp"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_over_450_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 450, f"{path.relative_to(ROOT)} has {lines} lines; split it by concern (docs/design.md, module map)"


def test_the_module_map_names_every_file():
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Module map"):]
    section = section[: section.index("\n## ", 4)] if "\n## " in section[4:] else section
    listed = set(re.findall(r"`(funcnet/[\w/]+\.py)`", section))
    files = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")}
    assert files - listed == set(), f"docs/design.md's module map does not list {sorted(files - listed)}"
    assert listed - files == set(), f"docs/design.md's module map lists missing files {sorted(listed - files)}"


def test_the_parallel_package_has_a_module_per_strategy():
    import importlib

    from funcnet import parallel

    # stages: the pipeline of any model (its traced forward cut at named modules), run by pipeline's tables
    strategies = {"data", "zero", "fsdp", "tensor", "pipeline", "stages", "mesh", "strategy"}
    files = {p.stem for p in (PACKAGE / "parallel").glob("*.py")} - {"__init__"}
    assert files == strategies
    for name in strategies:  # each opens with its torch counterpart
        doc = importlib.import_module(f"funcnet.parallel.{name}").__doc__
        assert "torch counterpart" in doc[:700], name
        assert getattr(parallel, name).__name__ == f"funcnet.parallel.{name}"
    for name in parallel.data.__all__:  # the data-parallel names stay where they were
        assert getattr(parallel, name) is getattr(parallel.data, name)
    for old in ("fsdp", "zero", "pipeline", "strategy", "tensor_parallel"):
        assert not (PACKAGE / f"{old}.py").exists(), f"funcnet/{old}.py should be gone (funcnet/parallel/)"


def test_the_recorder_skips_the_frames_of_the_whole_library():
    # the converter tells the user's lines from funcnet's by this folder: it must be the package's
    # root wherever the recorder's module sits in the tree
    import os

    import funcnet
    from funcnet.interop.trace.env import _FUNCNET_DIR

    assert _FUNCNET_DIR == os.path.dirname(os.path.abspath(funcnet.__file__))
