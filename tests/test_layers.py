"""The package's layers (``docs/architecture.md``, "Layers"), checked from the source.

Every ``import`` of every module under ``src/torchfuse`` is read with ``ast`` (module level and
inside functions alike), and three things must hold:

- no import cycle among torchfuse's modules;
- a module imports only from its own layer or a layer below it (``LAYERS``, lowest first);
- an import inside a function is one of ``LAZY_IMPORTS``: a module that is optional or heavy to
  import, each with its reason. Nothing in torchfuse is imported lazily to dodge a cycle.

Imports under ``if TYPE_CHECKING:`` never run, so they cannot close a cycle; they still have to
point down the layers.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "torchfuse"

# Lowest first. A module belongs to the layer of the longest prefix that names it (or a package
# above it). Within a layer any import is fine, as long as it closes no cycle.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("torchfuse.options", "torchfuse.ir")),
    ("frontend", ("torchfuse.frontend",)),
    ("lowering", ("torchfuse.lowering",)),
    ("scheduler", ("torchfuse.scheduler",)),
    ("codegen", ("torchfuse.codegen",)),
    ("runtime", ("torchfuse.runtime",)),
    ("report", ("torchfuse.diagnostics",)),
    ("pipeline", ("torchfuse.pipeline",)),
    ("api", ("torchfuse.api",)),
    ("tools", ("torchfuse", "torchfuse.tools", "torchfuse.cli", "torchfuse.__main__", "torchfuse.bench",
               "torchfuse.models")),
]

# Imports allowed inside functions: (importing module, imported module or a package above it) ->
# why it may not be imported with the module.
OPTIONAL_TRITON = "optional: Triton is installed on Linux only (pyproject), and only Triton kernels need it"
RICH = "rich: terminal tables and progress bars only, not loaded until something is drawn"
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("torchfuse.codegen.triton.interpreter_math", "triton"): OPTIONAL_TRITON,
    ("torchfuse.runtime.kernel_cache", "triton"): OPTIONAL_TRITON,
    ("torchfuse.runtime.launch", "triton"): OPTIONAL_TRITON,
    ("torchfuse.runtime.triton_module", "triton"): OPTIONAL_TRITON,
    ("torchfuse.runtime.triton_ahead", "triton"): OPTIONAL_TRITON,
    ("torchfuse.runtime.compile_worker", "triton"): OPTIONAL_TRITON,
    ("torchfuse.runtime.progress", "rich"): RICH,
    ("torchfuse.bench.output", "triton"): "optional: only asked for its version, on a GPU",
    ("torchfuse.bench.output", "matplotlib"): "optional (the dev extra): the results plot is skipped without it",
    ("torchfuse.bench.output", "rich"): RICH,
    ("torchfuse.bench.runner", "rich"): RICH,
    ("torchfuse.bench.models_hf", "transformers"): "optional: only the Hugging Face model cases need it",
    ("torchfuse.bench.models_vision", "timm"): "optional: only the timm model cases need it",
    ("torchfuse.bench.models_vision", "torchvision"): "optional: only the torchvision model cases need it",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool
    type_checking: bool

    def where(self) -> str:
        return f"{self.importer}:{self.line}"


def module_files() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package ``__init__``)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules an import statement loads: ``from a import b`` is ``a.b`` when that is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def collect_imports() -> list[Import]:
    modules = module_files()
    known = set(modules)
    found: list[Import] = []

    def visit(node: ast.AST, module: str, is_package: bool, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, module, is_package, known):
                    found.append(Import(module, target, child.lineno, in_function, type_checking))
                continue
            function = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and _is_type_checking(child):
                for statement in child.body:  # the else branch runs
                    visit(ast.Module(body=[statement], type_ignores=[]), module, is_package, function, True)
                for statement in child.orelse:
                    visit(ast.Module(body=[statement], type_ignores=[]), module, is_package, function, type_checking)
                continue
            visit(child, module, is_package, function, type_checking)

    for module, (path, is_package) in modules.items():
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), module, is_package, False, False)
    return found


def _matches(imported: str, prefix: str) -> bool:
    return imported == prefix or imported.startswith(prefix + ".")


def _internal(imports: list[Import]) -> list[Import]:
    return [i for i in imports if _matches(i.imported, "torchfuse")]


def layer_of(module: str) -> int:
    best = (-1, -1)  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _matches(module, prefix) and len(prefix) > best[0]:
                best = (len(prefix), index)
    assert best[1] >= 0, f"{module} is in no layer: add it to LAYERS in tests/test_layers.py"
    return best[1]


def _lazy_entry(imp: Import, table: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    """The most specific entry of ``table`` that allows ``imp``, if any."""
    entries = [(importer, prefix) for importer, prefix in table
               if imp.importer == importer and _matches(imp.imported, prefix)]
    return max(entries, key=lambda entry: len(entry[1]), default=None)


def find_cycle(edges: dict[str, dict[str, Import]]) -> list[Import] | None:
    """One import cycle as the imports that form it, each importing the next module, or None."""
    done: set[str] = set()
    path: list[Import] = []  # the imports from the start module down to the current one
    on_path: list[str] = []

    def visit(module: str) -> list[Import] | None:
        on_path.append(module)
        for target, imp in sorted(edges.get(module, {}).items()):
            if target in on_path:
                return path[on_path.index(target):] + [imp]
            if target not in done:
                path.append(imp)
                cycle = visit(target)
                if cycle is not None:
                    return cycle
                path.pop()
        on_path.pop()
        done.add(module)
        return None

    for module in sorted(edges):
        if module not in done:
            cycle = visit(module)
            if cycle is not None:
                return cycle
    return None


def test_every_module_is_in_a_layer():
    for module in module_files():
        layer_of(module)


def test_no_import_cycle_among_torchfuse_modules():
    edges: dict[str, dict[str, Import]] = {}
    for imp in _internal(collect_imports()):
        if imp.type_checking or imp.importer == imp.imported:
            continue
        edges.setdefault(imp.importer, {}).setdefault(imp.imported, imp)
    cycle = find_cycle(edges)
    assert cycle is None, ("import cycle (each module:line imports the next): "
                           + " -> ".join(step.where() for step in cycle) + f" -> {cycle[0].importer}")


def test_imports_only_go_down_the_layers():
    upward = [f"{imp.where()} imports {imp.imported} ({LAYERS[layer_of(imp.importer)][0]} -> "
              f"{LAYERS[layer_of(imp.imported)][0]})"
              for imp in _internal(collect_imports()) if layer_of(imp.imported) > layer_of(imp.importer)]
    order = " < ".join(name for name, _ in LAYERS)
    assert not upward, f"imports up the layers ({order}):\n" + "\n".join(upward)


def test_imports_inside_functions_are_only_the_listed_optional_or_heavy_ones():
    lazy = [imp for imp in collect_imports() if imp.in_function and not imp.type_checking]
    unlisted = [f"{imp.where()} imports {imp.imported} inside a function" for imp in lazy
                if _lazy_entry(imp, LAZY_IMPORTS) is None]
    assert not unlisted, ("import these at module level, or add them to LAZY_IMPORTS with the reason "
                          "(optional or heavy modules only):\n" + "\n".join(unlisted))


def test_every_listed_lazy_import_still_exists():
    used = {_lazy_entry(imp, LAZY_IMPORTS) for imp in collect_imports() if imp.in_function}
    stale = sorted(set(LAZY_IMPORTS) - used)
    assert not stale, f"remove these entries from tests/test_layers.py, nothing imports them lazily: {stale}"


def test_product_code_never_imports_inductor():
    inductor = [imp.where() for imp in collect_imports() if _matches(imp.imported, "torch._inductor")]
    assert not inductor, f"torchfuse is its own compiler; torch._inductor imported at {inductor}"


def test_find_cycle_names_the_imports_that_form_it():
    def edge(a: str, b: str, line: int) -> Import:
        return Import(a, b, line, False, False)

    edges = {"a": {"b": edge("a", "b", 1)}, "b": {"c": edge("b", "c", 2)}, "c": {"a": edge("c", "a", 3)}}
    assert [(i.importer, i.imported) for i in find_cycle(edges)] == [("a", "b"), ("b", "c"), ("c", "a")]
    assert find_cycle({"a": {"b": edge("a", "b", 1)}, "b": {}}) is None
