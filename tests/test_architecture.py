"""The architecture (issue 18): no pesto_ir module is in an import cycle, counting the imports made
inside functions; every top-level module sits in a layer of the `lint-imports` contract
(pyproject.toml); the pass manager knows the built-in passes without importing them.

The graph is grimp's, the one `lint-imports` checks: every `import` statement, wherever it is, except
those under `if TYPE_CHECKING:` (they never run; pyproject.toml says which one there is and why).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # installed with import-linter (the dev extra)

ROOT = Path(__file__).resolve().parent.parent

# Imports that close a cycle in files this round may not edit (issue 18 names them). Each entry
# must still exist (the test says when one is gone: drop it here); no other cycle may appear.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("pesto_ir", cache_dir=None, exclude_type_checking_imports=True)


def test_graph_sees_the_sub_packages(graph):
    # passes/, frontends/ and backends/ are reached through the symlinks under pesto_ir/
    for module in ("pesto_ir.passes.place", "pesto_ir.frontends.text", "pesto_ir.backends.gantt"):
        assert module in graph.modules, f"{module} is missing: is the symlink under pesto_ir/ there?"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
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


def _where(graph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return "; ".join(f"l.{d['line_number']}: {d['line_contents']}" for d in details)


def test_no_import_cycle(graph):
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    for importer, imported in KNOWN_CYCLE_EDGES:
        assert imported in edges[importer], f"{importer} no longer imports {imported}: drop it from KNOWN_CYCLE_EDGES"
        edges[importer].discard(imported)
    cycles = _cycles(edges)
    report = []
    for component in cycles:
        members = set(component)
        report.append(" <-> ".join(component))
        report += [f"    {a} -> {b} ({_where(graph, a, b)})" for a in component for b in sorted(edges[a] & members)]
    assert not cycles, "import cycles:\n" + "\n".join(report)


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _layers_contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert "ignore_imports" not in config, "no import is waived"
    contracts = [c for c in config["contracts"] if c["type"] == "layers"]
    assert all("ignore_imports" not in c for c in config["contracts"]), "no import is waived"
    return contracts


def _groups(layers: list[str]) -> list[set[str]]:
    return [{name.strip() for name in layer.replace("|", ":").split(":")} for layer in layers]


def test_every_module_is_in_a_layer(graph):
    """Each layers contract names every child of its container (the root package when it has none)."""
    for contract in _layers_contracts():
        for container in contract.get("containers", [None]):
            prefix = f"{container}." if container else ""
            named = {prefix + name for group in _groups(contract["layers"]) for name in group}
            children = graph.find_children(container or "pesto_ir")
            covered = {c for c in children if any(n == c or n.startswith(c + ".") for n in named)}
            assert children - covered == set(), f"{contract['id']}: modules in no layer"
            assert named - set(graph.modules) == set(), f"{contract['id']}: layers name modules that do not exist"


def test_the_main_contract_has_small_layers():
    """At least six layers, none a bag of more than eight modules: the layers say the architecture."""
    (main,) = [c for c in _layers_contracts() if "containers" not in c]
    groups = _groups(main["layers"])
    assert len(groups) >= 6 and max(len(g) for g in groups) <= 8


def test_no_module_is_over_600_lines():
    folders = [ROOT / "pesto_ir", ROOT / "passes", ROOT / "frontends", ROOT / "backends"]
    files = {f.resolve() for d in folders for f in d.rglob("*.py")}
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > 600}
    assert long == {}


def test_pass_manager_knows_the_built_in_passes_without_importing_them():
    # the pass manager imports no pass (the passes import it); `import pesto_ir` registers them
    code = ("from pesto_ir.passmanager import PassManager, Pipeline; "
            "print(Pipeline.parse('verify,dce,annotate-costs,coarsen,place,expand,simulate,microbatch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "verify,dce,annotate-costs,coarsen,place,expand,simulate,microbatch"
