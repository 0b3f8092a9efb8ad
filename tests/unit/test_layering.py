"""The import structure, declared once: which package may import which, and no cycles.

Type-only imports (under ``if TYPE_CHECKING``) count: they show the same coupling."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("protocol", "broker", "client", "deploy")

# Top-level packages: each may import only those listed for it (and itself).
TOP_LEVEL = {
    "protocol": set(),
    "broker": {"protocol"},
    "client": {"protocol"},
    "deploy": {"protocol", "broker", "client"},
}

# Inside broker/, lowest first: a subsystem imports only subsystems of earlier layers.
# Subsystems of one layer know nothing of each other.
BROKER_LAYERS = [
    {"common"},
    {"purgatory", "storage", "metadata", "network"},
    {"quota"},  # client and replication quotas: rates and throttle times on the timer
    {"raft", "replication"},
    {"controller", "coordinator", "transaction"},
    {"apis", "prometheus_export", "kafka"},
    {"server"},  # Broker: builds the others in order and wires them
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "minibroker." + ".".join(parts)


MODULES = {module_name(p): p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}
# C extension modules (setup.py builds them from these sources): they import nothing of ours.
EXTENSIONS = {module_name(p) for folder in FOLDERS for p in (ROOT / folder).rglob("*.c")}


def imports_of(path: Path) -> set[str]:
    """Our modules ``path`` imports, each resolved to a module (not a name inside one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import; we import minibroker.* by name"
            if node.module.startswith("minibroker."):
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    found.add(name if name in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minibroker.")}
    return found


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def top(name: str) -> str:
    return name.split(".")[1]


def subsystem(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if parts[1] == "broker" and len(parts) > 2 else None


def test_every_import_names_a_module_of_ours():
    unknown = {
        (m, d) for m, deps in GRAPH.items() for d in deps if d not in MODULES.keys() | EXTENSIONS
    }
    assert not unknown


def test_top_level_packages_import_only_downwards():
    wrong = sorted(
        (m, d)
        for m, deps in GRAPH.items()
        for d in deps
        if top(d) != top(m) and top(d) not in TOP_LEVEL[top(m)]
    )
    assert not wrong, "imports against the layering: " + ", ".join(f"{a} -> {b}" for a, b in wrong)


def test_broker_subsystems_import_only_lower_layers():
    layer_of = {name: i for i, layer in enumerate(BROKER_LAYERS) for name in layer}
    broker_modules = [m for m in GRAPH if subsystem(m)]
    assert {subsystem(m) for m in broker_modules} <= set(layer_of), "a subsystem with no layer"
    wrong = sorted(
        (m, d)
        for m in broker_modules
        for d in GRAPH[m]
        if subsystem(d)
        and subsystem(d) != subsystem(m)
        and layer_of[subsystem(d)] >= layer_of[subsystem(m)]
    )
    assert not wrong, "imports against the layering: " + ", ".join(f"{a} -> {b}" for a, b in wrong)


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            # A package's __init__ re-exporting its own modules is not a cycle of ideas.
            if w not in GRAPH or v.startswith(w + "."):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_every_package_is_installed():
    """pyproject.toml lists packages by hand (folders map to minibroker.* names)."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        module_name(p.parent / "__init__.py")
        for p in ROOT.glob("*/**/__init__.py")
        if p.parts[len(ROOT.parts)] in FOLDERS
    }
    assert listed == on_disk
