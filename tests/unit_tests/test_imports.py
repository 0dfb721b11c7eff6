"""The public API is small and deliberate, and the layers import downwards only."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import langchain_tag

PACKAGE = Path(langchain_tag.__file__).parent

# Only the top level is pinned: the sub-packages' own names may change with them.
EXPECTED_ALL = [
    "Rule",
    "Rulebook",
    "RulebookError",
    "TAGError",
    "TAGMiddleware",
    "TAGRetriever",
    "__version__",
    "aextract_rules",
    "build_extraction_graph",
    "build_query_graph",
    "extract_rules",
]
"""The faces, the rulebook types, extraction's entry points and the base error."""


def test_public_names_are_pinned() -> None:
    assert sorted(langchain_tag.__all__) == sorted(EXPECTED_ALL)
    missing = [
        name for name in langchain_tag.__all__ if not hasattr(langchain_tag, name)
    ]
    assert missing == []


def test_top_level_names_are_the_sub_packages_objects() -> None:
    for name in langchain_tag.__all__:
        if name == "__version__":
            continue
        source = langchain_tag._LAZY[name]
        assert getattr(langchain_tag, name) is getattr(
            importlib.import_module(source), name
        )
    with pytest.raises(AttributeError, match="no attribute 'RetryPolicy'"):
        _ = langchain_tag.RetryPolicy


def test_names_moved_off_the_top_level_still_resolve_with_a_warning() -> None:
    from langchain_tag.matching import ApplicabilityJudge  # noqa: PLC0415

    with pytest.warns(DeprecationWarning, match=r"from langchain_tag\.matching"):
        assert langchain_tag.ApplicabilityJudge is ApplicabilityJudge
    assert "ApplicabilityJudge" not in langchain_tag.__all__


def _runtime_modules() -> dict[str, ast.Module]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return modules


def _outside_functions(tree: ast.AST) -> list[ast.AST]:
    """The nodes of `tree` not inside a function body.

    They run at import time, or only for a type checker (`if TYPE_CHECKING:`),
    which counts as importing.
    """
    found: list[ast.AST] = []
    for node in ast.iter_child_nodes(tree):
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            found.extend(_outside_functions(node))
    return found


def _imported(module: str, tree: ast.Module, *, top_level_only: bool) -> set[str]:
    """The langchain_tag modules `module` imports.

    With `top_level_only`, at import time or for the type checker; else anywhere,
    in functions too.
    """
    found = set()
    nodes = _outside_functions(tree) if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = node.module
            if base.startswith("langchain_tag"):
                found.add(base)
                # `from package import submodule` imports the submodule too.
                found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(
                alias.name
                for alias in node.names
                if alias.name.startswith("langchain_tag")
            )
    return found - {module}


def test_runtime_code_never_imports_the_test_doubles() -> None:
    modules = _runtime_modules()
    offenders = [
        name
        for name, tree in modules.items()
        if not name.startswith("langchain_tag.testing")
        and any(
            imported.startswith("langchain_tag.testing")
            for imported in _imported(name, tree, top_level_only=False)
        )
    ]
    assert offenders == []


def test_no_import_cycles() -> None:
    modules = _runtime_modules()
    graph = {
        name: {
            imported
            for imported in _imported(name, tree, top_level_only=True)
            if imported in modules
        }
        for name, tree in modules.items()
    }
    # A package importing its own submodules to re-export them is not a cycle;
    # a submodule importing its package's siblings through the package is
    # counted as importing those siblings.
    graph = {
        name: {dep for dep in deps if not dep.startswith(name + ".")}
        for name, deps in graph.items()
    }
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


# Lower layers first; a module may import its own layer and those before it only.
LAYERS = [
    {
        "errors",
        "_text",
        "_delimiters",
        "_processes",
        "_graph",
        "_review",
        "_loading",
        "_names",
    },
    {
        "rules",
        "rule_schemas",
        "models",
        "_sql",
        "cache",
        "embeddings",
        "resources",
        "usage",
    },
    {"extraction", "matching", "execution", "metering"},
    {"learning", "batch"},
    {"engine"},
    {"settings", "estimate"},
    {"retrievers", "query_graph", "middleware", "bulk", "bulk_ray"},
    {"demo", "cli", "local_model"},
]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] == "testing":
        return None
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), None)


def test_layers_import_downwards_only() -> None:
    modules = _runtime_modules()
    unplaced = sorted(
        {name.split(".")[1] for name in modules if "." in name}
        - {"testing", *set().union(*LAYERS)}
    )
    assert unplaced == [], "place these in LAYERS"
    upward = sorted(
        f"{name} -> {imported}"
        for name, tree in modules.items()
        for imported in _imported(name, tree, top_level_only=False)
        if (low := _layer(name)) is not None
        and (high := _layer(imported)) is not None
        and high > low
    )
    assert upward == []


def test_the_library_never_imports_the_experiments() -> None:
    # langchain-tag-experiments builds on the library; never the other way round,
    # so the library's wheel stands alone.
    reaching = sorted(
        name
        for name, tree in _runtime_modules().items()
        if any(
            isinstance(node, ast.Import | ast.ImportFrom)
            and any(
                found.startswith("langchain_tag_experiments")
                for found in (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [alias.name for alias in node.names]
                )
            )
            for node in ast.walk(tree)
        )
    )
    assert reaching == []


HEAVY = (
    "langgraph",
    "langchain_tag.matching.judge",
    "chromadb",
    "langchain_openai",
    "langchain_core",
)


def _loaded_after(code: str, watched: tuple[str, ...] = HEAVY) -> set[str]:
    probe = (
        f"import sys\n{code}\n"
        f"print(','.join(m for m in {watched!r} if m in sys.modules))"
    )
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    return set(filter(None, done.stdout.strip().split(",")))


def test_tag_help_loads_neither_langgraph_nor_the_judge() -> None:
    code = (
        "import argparse\n"
        "from langchain_tag.cli import build_parser\n"
        "parser = build_parser()\n"
        "parser.format_help()\n"
        "for action in parser._actions:\n"
        "    if isinstance(action, argparse._SubParsersAction):\n"
        "        for sub in action.choices.values():\n"
        "            sub.format_help()"
    )
    assert _loaded_after(code) == set()


def test_importing_the_package_or_the_rules_is_light() -> None:
    assert _loaded_after("import langchain_tag, langchain_tag.rules") <= {
        "langchain_core"  # the rules' Document conversions
    }


NOT_OF_THE_LIBRARY = (
    "langchain_tag_experiments",
    "langchain_community",
    "langchain_classic",
    "langchain_text_splitters",
)
"""What the experiments need and the library's faces never load (nor depend on)."""


@pytest.mark.parametrize("face", ["retrievers", "middleware", "query_graph"])
def test_the_faces_load_nothing_of_the_experiments(face: str) -> None:
    # Their closure in modules and lines: benchmarks/bench_imports.py prints it.
    assert _loaded_after(f"import langchain_tag.{face}", NOT_OF_THE_LIBRARY) == set()


def test_runtime_modules_load_no_test_doubles() -> None:
    runtime = sorted(
        name
        for name in _runtime_modules()
        if not name.startswith("langchain_tag.testing")
    )
    code = (
        "import importlib, sys\n"
        f"for name in {runtime!r}:\n"
        "    if not name.endswith('__main__'):\n"
        "        importlib.import_module(name)\n"
        "print('langchain_tag.testing' in sys.modules)"
    )
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


EXPERIMENTS = PACKAGE.parent / "experiments" / "langchain_tag_experiments"

PRIVATE_HELPERS_IN_USE = {
    "langchain_tag._delimiters",
    "langchain_tag._processes",
    "langchain_tag._text",
}
"""Layer-0 helpers the experiments still import (issue 33): to be given public
homes, then this set emptied. Nothing else private may be imported from there."""


def test_the_experiments_import_no_private_module_of_the_library() -> None:
    private: set[str] = set()
    for path in EXPERIMENTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [
                    f"{node.module}.{alias.name}" for alias in node.names
                ]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            private.update(
                f"{path.name}: {name}"
                for name in names
                if name.startswith("langchain_tag.")
                and any(
                    part.startswith("_") and not part.startswith("__")
                    for part in name.split(".")[1:]
                )
                and not name.startswith(tuple(PRIVATE_HELPERS_IN_USE))
            )
    assert sorted(private) == []
