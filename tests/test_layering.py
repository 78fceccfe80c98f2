"""The package's layering, read from the source with `ast` (every import, function-level ones too).

Layers, lowest first: `spec` and `files` (the shared vocabulary and safe writes), `kernels` (Triton
kernels and their torch references), `runtime` (the model and the decoding loops) and `sim` (the
simulator) side by side, then what joins them (`profiler`, `validate`, `studies`, `cli`, `run`). A layer
imports only layers below it, so the runtime runs without the simulator, the simulator plans
without torch, and a kernel's test needs no model.

Imports inside functions hide such edges and make the cost of an import hard to see: they are
kept for heavy or optional dependencies only (`LAZY_OK`, `LAZY_OK_IN`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import swiftspec
from swiftspec.runtime.graphs import DEFAULT_BUCKETS
from swiftspec.sim.latency import GRAPH_BUCKETS

PACKAGE_DIR = Path(swiftspec.__file__).parent
LOWER = ("swiftspec.errors", "swiftspec.spec", "swiftspec.files", "swiftspec.kernels", "swiftspec.runtime", "swiftspec.sim")
# Every other top-level module or package joins the lower layers (profiler, validate, studies, cli,
# the run entry points, ...): found from the files, so a new joining module is covered too.
JOINING = tuple(
    sorted(
        f"swiftspec.{p.stem}"
        for p in PACKAGE_DIR.iterdir()
        if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").exists()
        if f"swiftspec.{p.stem}" not in LOWER
    )
)

# layer -> what no module of it may import (a prefix names a package or a module)
FORBIDDEN = {
    "swiftspec.kernels": ("swiftspec.runtime", "swiftspec.sim", *JOINING),
    "swiftspec.runtime": ("swiftspec.sim", *JOINING),
    "swiftspec.sim": ("swiftspec.runtime", *JOINING),
    "swiftspec.spec": ("swiftspec.kernels", "swiftspec.runtime", "swiftspec.sim", *JOINING),
    "swiftspec.files": ("swiftspec.spec", "swiftspec.kernels", "swiftspec.runtime", "swiftspec.sim", *JOINING),
}

# Function-level imports allowed anywhere: heavy or optional dependencies, imported where used.
LAZY_OK = {
    "transformers": "heavy; only for reading, converting or comparing checkpoints",
    "matplotlib": "heavy; only when a figure is drawn",
    "triton.experimental": "Gluon is experimental: absent or renamed in some Triton releases",
    "torch.distributed._symmetric_memory": "private torch module, absent in some releases",
    "gguf": "optional extra (`real`)",
    "accelerate": "optional extra (`real`)",
}
# ... and in one module only: (module, imported prefix) -> why
LAZY_OK_IN = {
    ("swiftspec.files", "torch"): "spec.py imports files.py: `plan` and the studies must not load torch",
    ("swiftspec.files", "triton"): "as torch: only when a result is stamped with the versions",
    # the CLI loads each verb's layer inside its command: `plan`, `simulate` and `--help` stay free of torch
    ("swiftspec.cli", "torch"): "only the verbs that run models load torch",
    ("swiftspec.cli", "swiftspec.runtime"): "loads torch: generate only",
    ("swiftspec.cli", "swiftspec.run"): "loads torch: run only",
    ("swiftspec.cli", "swiftspec.preflight"): "loads torch: the memory check of generate",
    ("swiftspec.cli", "swiftspec.validate"): "loads torch: validate only",
    ("swiftspec.cli", "swiftspec.profiler"): "loads torch: the profile verbs only",
    ("swiftspec.cli", "swiftspec.studies"): "loads matplotlib: study only",
    ("swiftspec.options", "torch"): "whether a GPU is visible: only the verbs that run models ask",
}


@dataclass(frozen=True)
class Import:
    """One imported name: `target` is the dotted module (plus the name for `from` imports)."""

    module: str  # the importing module, e.g. swiftspec.sim.search
    target: str  # e.g. swiftspec.sim.latency.LatencyModel
    line: int
    statement: str  # the source of the import, for messages
    in_function: bool


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import statement of one module's source, and `importlib.import_module("...")` calls."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(module, alias.name, child.lineno, ast.unparse(child), in_function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against the package
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    found.append(
                        Import(module, f"{base}.{alias.name}", child.lineno, ast.unparse(child), in_function)
                    )
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, (ast.Attribute, ast.Name))
                and (child.func.attr if isinstance(child.func, ast.Attribute) else child.func.id)
                == "import_module"
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                found.append(
                    Import(module, child.args[0].value, child.lineno, ast.unparse(child), in_function)
                )
            visit(child, nested)

    visit(tree, False)
    return found


def package_imports() -> list[Import]:
    out = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        out += imports_of(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layering_violations(imports: list[Import]) -> list[str]:
    """One line per import that crosses a layer the wrong way: module, line, statement, rule."""
    bad = []
    for imp in imports:
        for layer, forbidden in FORBIDDEN.items():
            if not _under(imp.module, layer):
                continue
            hit = next((f for f in forbidden if _under(imp.target, f)), None)
            if hit is not None:
                where = "function-level " if imp.in_function else ""
                bad.append(
                    f"{imp.module}:{imp.line}: {where}`{imp.statement}` ({layer} must not import {hit})"
                )
    return sorted(set(bad))


def lazy_import_offenders(imports: list[Import]) -> list[str]:
    """One line per function-level import that is not a heavy or optional dependency."""
    bad = []
    for imp in imports:
        if not imp.in_function:
            continue
        if any(_under(imp.target, p) for p in LAZY_OK):
            continue
        if any(imp.module == m and _under(imp.target, p) for m, p in LAZY_OK_IN):
            continue
        bad.append(f"{imp.module}:{imp.line}: `{imp.statement}`")
    return sorted(set(bad))


def test_layers_import_only_downwards():
    bad = layering_violations(package_imports())
    assert not bad, "imports against the layering (see this file's docstring):\n" + "\n".join(bad)


def test_function_level_imports_only_for_heavy_dependencies():
    bad = lazy_import_offenders(package_imports())
    assert not bad, (
        "function-level imports (move them to the top of the module; a heavy or optional dependency "
        "goes in LAZY_OK):\n" + "\n".join(bad)
    )


def test_the_rules_catch_a_violation():
    """The checks can fail: a synthetic simulator module importing the runtime inside a function,
    a kernel importing the model through a relative import, and spec importing the simulator."""
    sim_src = "import math\n\ndef f():\n    from swiftspec.runtime.model import Transformer\n    return Transformer\n"
    sim = imports_of(sim_src, "swiftspec.sim.fake")
    bad = layering_violations(sim)
    assert len(bad) == 1
    assert bad[0].startswith(
        "swiftspec.sim.fake:4: function-level `from swiftspec.runtime.model import Transformer`"
    )
    assert "swiftspec.sim must not import swiftspec.runtime" in bad[0]
    assert lazy_import_offenders(sim) == [
        "swiftspec.sim.fake:4: `from swiftspec.runtime.model import Transformer`"
    ]

    kernel = imports_of("from ..runtime import model\n", "swiftspec.kernels.fake")
    assert [i.target for i in kernel] == ["swiftspec.runtime.model"]
    assert len(layering_violations(kernel)) == 1
    spec = imports_of("import importlib\nimportlib.import_module('swiftspec.sim.search')\n", "swiftspec.spec")
    assert len(layering_violations(spec)) == 1

    # allowed: the runtime importing kernels and spec, a lazy heavy dependency, TYPE_CHECKING names
    ok_src = (
        "from typing import TYPE_CHECKING\nfrom swiftspec.kernels.gemv import gemv\nfrom swiftspec.spec import UserError\n"
        "if TYPE_CHECKING:\n    import numpy as np\n\ndef f():\n    from transformers import AutoConfig\n"
    )
    ok = imports_of(ok_src, "swiftspec.runtime.fake")
    assert layering_violations(ok) == [] and lazy_import_offenders(ok) == []


def test_every_layer_is_scanned():
    """Guards the scan itself: each layer's modules are found and some of their imports seen."""
    assert {"swiftspec.profiler", "swiftspec.validate", "swiftspec.studies", "swiftspec.cli"} <= set(JOINING)
    imports = package_imports()
    modules = {i.module for i in imports}
    for layer in FORBIDDEN:
        assert any(_under(m, layer) for m in modules), layer
    assert any(
        i.module == "swiftspec.runtime.model" and _under(i.target, "swiftspec.kernels") for i in imports
    )


def test_the_simulator_and_the_runtime_agree_on_graph_buckets():
    """sim.latency repeats the runtime's CUDA-graph buckets (it imports nothing of the runtime)."""
    assert GRAPH_BUCKETS == DEFAULT_BUCKETS
