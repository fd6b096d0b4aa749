"""The layers of docs/architecture.md, checked against the imports of every ingero module.

Every ``import`` / ``from ... import`` of an ingero module (at the top or
inside a function: a lazy import is still a dependency) is read with ``ast``.
Each layer names the layers it may import; a module importing anything else
is a violation, and the module graph has no cycle.  What is wrong today is
listed in ALLOWED_VIOLATIONS / ALLOWED_CYCLES with the reason: those lists
may only shrink (a test fails when an entry is no longer needed, so a fix
removes its entry in the same commit).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "ingero"

# Imported by every layer: the package (its __version__), the one error type, the event
# contract (ingero.events: the op table, the Python mirror of bpf/events.h, the time units),
# the trace's interface to its hooks and its view (ingero.traceapi), the one set of value
# parsers (the CLI and the socket's request decoder) and the host facts (who invoked us,
# autogroups, live pids).  They import nothing of ingero but one another
# (test_the_base_imports_only_the_base).
BASE_LAYERS = {"events"}
BASE_MODULES = {"ingero", "ingero.errors", "ingero.traceapi", "ingero.values", "ingero.host"}

# layer -> the layers its modules may import (besides their own and BASE).  The data
# flows bpf -> collect -> store -> analyze -> render -> commands; sample (host and GPU
# metrics) and importer (PyTorch profiler traces into the same store) are inputs beside
# collect; export (Perfetto, Parquet, the HTML report) is an output beside render;
# daemon (the query server: SQL, explain, status over a socket), demo (runs the tracer,
# explains its DB) and check (proves the BPF stack loads) are services above render
# that commands call.
MAY_IMPORT: dict[str, set[str]] = {
    # collect hands its decoded batches to the store (the data flow's first arrow)
    "collect": {"store"},
    "sample": {"collect"},
    "importer": {"collect", "store"},
    "store": set(),
    "analyze": {"store"},
    "render": {"analyze", "store"},
    "export": {"analyze", "store", "render"},
    "daemon": {"store", "analyze", "render"},
    "demo": {"store", "analyze", "render"},
    "check": {"collect", "sample", "store"},
    # metrics (Prometheus, per flush; diagnosis through the tracer's socket) and mcpserver
    # (the MCP tools over daemon.access) are services above the daemon, like demo
    "metrics": {"collect", "store", "daemon"},
    "mcpserver": {"store", "analyze", "render", "daemon", "check"},
    # fleet (issue 20): publishing is a trace hook (collect) that reads the store, runs explain and
    # reuses export's table selection; reading uses the daemon's SQL guard
    "fleet": {"collect", "sample", "store", "analyze", "export", "daemon"},
    "commands": {"collect", "sample", "importer", "store", "analyze", "render", "export", "daemon", "demo", "check",
                 "metrics", "mcpserver", "fleet", "cli"},
    # cli prints the one error line, through render's sanitiser (a message may quote untrusted text)
    "cli": {"commands", "render"},
    "__main__": {"cli"},
}

# (importer, imported): known violations, issue 16.  May only shrink.
ALLOWED_VIOLATIONS: dict[tuple[str, str], str] = {
}

# Import cycles (sets of modules): known, may only shrink.
ALLOWED_CYCLES: list[frozenset[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The ingero modules ``name`` imports (``from pkg import mod`` counts as mod)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # `import ingero.x.y.attr` style: the longest module prefix
                t = t.rpartition(".")[0]
            if t.startswith("ingero") and t != name:
                found.add(t)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


BASE = BASE_MODULES | {name for name in MODULES if layer(name) in BASE_LAYERS}


def violations() -> set[tuple[str, str]]:
    out = set()
    for name, targets in GRAPH.items():
        if name in BASE:
            continue
        mine = layer(name)
        for t in targets:
            if t in BASE or layer(t) == mine or layer(t) in MAY_IMPORT[mine]:
                continue
            out.add((name, t))
    return out


def cycles() -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan), plus self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_known_layer():
    unknown = sorted(n for n in MODULES if n not in BASE and layer(n) not in MAY_IMPORT)
    assert unknown == [], "place new top-level modules in MAY_IMPORT (and docs/architecture.md)"


def test_the_base_imports_only_the_base():
    # what every layer imports must not pull a layer in behind it
    found = sorted((name, t) for name in BASE for t in GRAPH[name] if t not in BASE)
    assert found == [], "a base module imports a layer: " + ", ".join(f"{a} -> {b}" for a, b in found)


def test_the_import_reader_sees_real_edges():
    # guards the checker itself: a few edges that exist, both absolute and lazy
    assert "ingero.analyze.model" in GRAPH["ingero.render.json"]
    assert "ingero.cli" in GRAPH["ingero.__main__"]
    assert "ingero.store.db" in GRAPH["ingero.daemon.access"]
    assert "ingero.events.ops" in GRAPH["ingero.events.records"]
    assert "ingero.events.ops" in GRAPH["ingero.store.derive"]


def test_no_module_imports_a_layer_above_it():
    found = violations()
    new = sorted(found - set(ALLOWED_VIOLATIONS))
    assert new == [], ("a module imports a layer it may not (see MAY_IMPORT): "
                       + ", ".join(f"{a} -> {b}" for a, b in new))
    fixed = sorted(set(ALLOWED_VIOLATIONS) - found)
    assert fixed == [], "no longer a violation: remove it from ALLOWED_VIOLATIONS: " + repr(fixed)


def test_no_import_cycle():
    found = set(cycles())
    new = [sorted(c) for c in found - set(ALLOWED_CYCLES)]
    assert new == [], f"import cycles: {new}"
    fixed = [sorted(c) for c in set(ALLOWED_CYCLES) - found]
    assert fixed == [], f"no longer a cycle: remove it from ALLOWED_CYCLES: {fixed}"
