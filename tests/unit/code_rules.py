"""The code's house rules, read from the source with ``ast`` (used by test_architecture.py).

Each check takes the modules of a tree (:func:`load`) and returns what breaks its rule, one
line each, so the same code judges the real tree and a planted one (the test that the
checker sees a violation):

* :func:`cycles`: no import cycle between modules. An import inside a function counts (it
  runs, only later); one under ``if TYPE_CHECKING:`` does not (it never runs).
* :func:`long_modules`, :func:`long_functions`: at most 450 lines a module, 80 a function.
* :func:`private_imports`: no ``_name`` of one module used by another (``from m import _x``,
  or ``m._x`` through an imported module).
* :func:`reexports`: one import path per name: nothing imported *from* a module that only
  imported it itself, no ``__all__`` naming an imported name (a front door).
* :func:`state_writers`: a run's state is written by :mod:`dstui.core.run_status` alone.

Runners import each other by bare names (``import common``: their folder is on sys.path);
those resolve to ``runners.<name>``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


@dataclass(frozen=True)
class Module:
    name: str  # dotted, as imported
    path: Path
    rel: str  # path relative to the tree's root, for messages
    tree: ast.Module
    lines: int

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]

    @property
    def bare_root(self) -> str | None:
        """The package whose modules import each other by bare names (runners/), if this is one of its."""
        return self.name.split(".")[0] if self.name.startswith("runners.") else None


def load(root: Path, packages: Iterable[str]) -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            text = p.read_text()
            mods[".".join(parts)] = Module(".".join(parts), p, str(p.relative_to(root)), ast.parse(text, str(p)), len(text.splitlines()))
    return mods


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    names: tuple[str, ...]  # the names a from-import takes (empty for `import x`)
    base: str  # the module named in the statement, resolved


def _executed(node: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: all of them but the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for stmt in child.orelse for n in [stmt, *_executed(stmt)])
            continue
        yield child
        yield from _executed(child)


def _ours(mods: dict[str, Module], name: str, importer: Module) -> str | None:
    """The module of the tree an import names (the nearest enclosing one), or None: not ours."""
    candidates = [name]
    if importer.bare_root and name.split(".")[0] not in ("dstui", "runners"):
        candidates.insert(0, f"{importer.bare_root}.{name}")
    for cand in candidates:
        while cand:
            if cand in mods:
                return cand
            cand = cand.rpartition(".")[0]
    return None


def _from_base(m: Module, node: ast.ImportFrom) -> str:
    """The module a from-import names, relative ones resolved against the importer's package."""
    if not node.level:
        return node.module or ""
    parts = m.package.split(".")[: len(m.package.split(".")) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def edges(mods: dict[str, Module]) -> list[Edge]:
    out = []
    for m in mods.values():
        for node in _executed(m.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    dst = _ours(mods, a.name, m)
                    if dst and dst != m.name:
                        out.append(Edge(m.name, dst, node.lineno, (), dst))
            elif isinstance(node, ast.ImportFrom):
                resolved = _ours(mods, _from_base(m, node), m)
                if resolved is None:
                    continue
                for a in node.names:
                    sub = f"{resolved}.{a.name}"
                    dst = sub if sub in mods else resolved
                    if dst != m.name:
                        out.append(Edge(m.name, dst, node.lineno, (a.name,) if dst == resolved else (), resolved))
    return out


def cycles(mods: dict[str, Module]) -> list[str]:
    """Each strongly connected group of modules (Tarjan), with the imports that close it."""
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], int] = {}
    for e in edges(mods):
        graph[e.src].add(e.dst)
        where.setdefault((e.src, e.dst), e.line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:  # recursion depth is bounded by the number of modules (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(mods):
        if v not in index:
            strong(v)
    return [" <-> ".join(g) + ": " + ", ".join(f"{a}:{where[a, b]} imports {b}" for a in g for b in sorted(graph[a]) if b in g)
            for g in found]  # fmt: skip


def long_modules(mods: dict[str, Module], limit: int = MAX_MODULE_LINES) -> list[str]:
    return [f"{m.rel}: {m.lines} lines" for m in mods.values() if m.lines > limit]


def long_functions(mods: dict[str, Module], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for m in mods.values():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    out.append(f"{m.rel}:{node.lineno} {node.name}: {n} lines")
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_aliases(mods: dict[str, Module], m: Module) -> dict[str, str]:
    """Local name -> module of the tree, for every module this one binds to a name (``from a import b``, ``import a.b as c``)."""
    aliases = {}
    for node in _executed(m.tree):
        if isinstance(node, ast.ImportFrom):
            base = _ours(mods, _from_base(m, node), m)
            for a in node.names:
                if base and f"{base}.{a.name}" in mods:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                target = _ours(mods, a.name, m)
                if target and (a.asname or "." not in a.name):
                    aliases[a.asname or a.name] = target
    return aliases


def private_imports(mods: dict[str, Module]) -> list[str]:
    out = [f"{mods[e.src].rel}:{e.line} imports {e.dst}.{name}"
           for e in edges(mods) for name in e.names if _private(name)]  # fmt: skip
    for m in mods.values():
        aliases = _module_aliases(mods, m)
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _private(node.attr) and aliases[node.value.id] != m.name):  # fmt: skip
                out.append(f"{m.rel}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return out


def _own_names(m: Module) -> tuple[set[str], set[str]]:
    """(names the module defines at top level, names it imports at top level, under ``if``/``try`` too)."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in m.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        scope = [node] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        if isinstance(node, (ast.If, ast.Try)):
            scope = list(ast.walk(node))
        for sub in scope:
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                imported.update(a.asname or a.name.split(".")[0] for a in sub.names)
    return defined, imported


def reexports(mods: dict[str, Module], *, attributes_of: Iterable[str] = ("dstui", "runners")) -> list[str]:
    """Names taken from a module that only imported them, and ``__all__`` lists naming imported names.
    ``attributes_of``: the packages whose ``module.name`` uses are judged too (the product, not its tests)."""
    own = {name: _own_names(m) for name, m in mods.items()}
    out = []
    for e in edges(mods):
        defined, imported = own[e.dst]
        for name in e.names:
            if name not in defined and name in imported and f"{e.dst}.{name}" not in mods:
                out.append(f"{mods[e.src].rel}:{e.line} takes {name} from {e.dst}, which imports it")
    for m in mods.values():
        defined, imported = own[m.name]
        for node in m.tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                listed = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
                out += [f"{m.rel}:{node.lineno} __all__ names {n}, which it imports" for n in listed if n not in defined]
        if m.name.split(".")[0] not in attributes_of:
            continue
        aliases = _module_aliases(mods, m)
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = aliases[node.value.id]
                t_defined, t_imported = own[target]
                if node.attr in t_imported and node.attr not in t_defined and f"{target}.{node.attr}" not in mods:
                    out.append(f"{m.rel}:{node.lineno} uses {target}.{node.attr}, which it imports")
    return out


STATE_WRITERS = {"dstui.core.rundir", "dstui.core.run_status"}


def state_writers(mods: dict[str, Module]) -> list[str]:
    """Calls that could write a run's state other than through dstui.core.run_status: ``merge_status``
    anywhere else, and ``update_status(state=...)`` (which raises at run time as well)."""
    out = []
    for m in mods.values():
        if m.name in STATE_WRITERS:
            continue
        for node in ast.walk(m.tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn == "merge_status" or (fn == "update_status" and any(k.arg == "state" for k in node.keywords)):
                out.append(f"{m.rel}:{node.lineno} {fn}(...) writes a state; use dstui.core.run_status")
    return out
