"""The direction of the arrows: which stage may import which, read from the source with ``ast``.

The layout under ``dstui/`` is the data flow (docs/ARCHITECTURE.md). These checks fail the
moment a lower stage reaches up (e.g. ``spec`` importing ``execute``), the core pulls in the
TUI's libraries, a heavy library is imported at module level (start-up cost, and the core must
work without torch/deepspeed), or the runners import the TUI. The house rules over every module of
dstui/ and runners/ (no import cycle, no module over 450 lines or function over 80, no private name
used across modules, one import path per name, a run's state written by dstui.core.run_status
alone) are read by tests/unit/code_rules.py, and shown to catch a planted violation of each.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import code_rules
import pytest

# one worker parses the tree for the module's rules (product() below), not each worker it lands on
pytestmark = pytest.mark.xdist_group("architecture")

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "dstui"

# stage -> the stages it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "spec": {"core"},
    "revisions": {"core", "spec"},
    "tracking": {"core"},
    "execute": {"core", "spec", "revisions", "tracking"},
    "analysis": {"core", "spec", "tracking"},
    "report": {"core", "spec", "tracking", "analysis"},
    "importer": {"core", "spec", "tracking", "analysis"},
    # one service per use case (launch, watch, takeover, cancel/retry), over the stages for both faces
    "usecases": {"core", "spec", "revisions", "tracking", "execute", "analysis", "report", "importer"},
    "bisect": {"core", "spec", "revisions", "tracking", "execute", "analysis", "report", "usecases"},
    "tune": {"core", "spec", "revisions", "tracking", "execute", "analysis", "report", "usecases"},
    # the faces reach batches through the use cases, never through execute (see FACES below)
    "commands": {"core", "spec", "revisions", "tracking", "analysis", "report", "importer", "bisect", "usecases", "tune"},
    "tui": {"core", "spec", "revisions", "tracking", "analysis", "report", "importer", "bisect", "usecases", "tune"},
}
# The CLI's `tui`/`demo` commands start the TUI: the one arrow from commands to tui.
STARTS_TUI = {"dstui/commands/tui.py", "dstui/commands/demo.py"}
# The two faces: they render and ask; launching, watching and taking over are the use cases'.
FACES = ("commands", "tui")
# `dstui supervise BATCH` is the detached supervisor's own entry point (the process the launch service
# spawns), not a face over it: the one module of a face that imports dstui.execute.
FACE_EXECUTE_EXCEPTIONS = {"dstui/commands/supervise.py"}
UI_LIBS = {"textual", "textual_plotext", "plotext", "rich"}
HEAVY_LIBS = {"torch", "deepspeed", "transformers", "datasets", "mlflow", "matplotlib", "pandas", "scipy"}


@dataclass(frozen=True)
class Import:
    file: str
    line: int
    module: str
    top_level: bool  # executed when the module is imported (not inside a function)


def _imports(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = str(path.relative_to(REPO))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only: never executed
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import(rel, child.lineno, a.name, not in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative import: resolve against this package
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    mod = ".".join([*base, child.module] if child.module else base)
                else:
                    mod = child.module or ""
                out.append(Import(rel, child.lineno, mod, not in_function))
                # `from dstui import x` names a stage in its names
                if mod == "dstui":
                    out.extend(Import(rel, child.lineno, f"dstui.{a.name}", not in_function) for a in child.names)
            visit(child, nested)

    visit(tree, False)
    return out


def _stage(rel: str) -> str | None:
    parts = Path(rel).parts
    return parts[1] if len(parts) > 2 and parts[0] == "dstui" else None


def _all(root: Path) -> list[Import]:
    return [i for p in sorted(root.rglob("*.py")) for i in _imports(p)]


def test_every_dstui_module_belongs_to_a_known_stage() -> None:
    stray = sorted(
        str(p.relative_to(REPO))
        for p in PACKAGE.rglob("*.py")
        if _stage(str(p.relative_to(REPO))) not in ALLOWED and p.parent != PACKAGE
    )
    assert not stray, f"modules outside the stage packages (add the stage to ALLOWED and ARCHITECTURE.md): {stray}"


def test_lower_stages_never_import_higher_ones() -> None:
    bad = []
    for imp in _all(PACKAGE):
        src = _stage(imp.file)
        parts = imp.module.split(".")
        if src is None or parts[0] != "dstui" or len(parts) < 2:
            continue
        dst = parts[1]
        if dst in (src, "__main__") or dst in ALLOWED[src]:
            continue
        if dst == "tui" and imp.file in STARTS_TUI:
            continue
        if dst == "execute" and imp.file in FACE_EXECUTE_EXCEPTIONS:
            continue
        bad.append(f"{imp.file}:{imp.line} ({src}) imports {imp.module} ({dst})")
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def test_the_faces_never_import_execute() -> None:
    """commands/ and tui/ call dstui.usecases; an import of dstui.execute there (at any depth, in a function
    too) would let a face orchestrate a launch, a follow loop or a takeover of its own again."""
    bad = [
        f"{i.file}:{i.line} imports {i.module}"
        for i in _all(PACKAGE)
        if _stage(i.file) in FACES and i.file not in FACE_EXECUTE_EXCEPTIONS
        and (i.module == "dstui.execute" or i.module.startswith("dstui.execute."))
    ]
    assert not bad, "the faces go through dstui.usecases:\n" + "\n".join(bad)


def test_core_never_imports_ui_libraries() -> None:
    bad = [
        f"{i.file}:{i.line} imports {i.module}"
        for i in _all(PACKAGE)
        if _stage(i.file) not in (None, "tui") and i.module.split(".")[0] in UI_LIBS
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("root", ["dstui", "dstui/tui"])
def test_heavy_libraries_are_imported_inside_functions_only(root: str) -> None:
    bad = [
        f"{i.file}:{i.line} imports {i.module} at module level"
        for i in _all(REPO / root)
        if i.top_level and i.module.split(".")[0] in HEAVY_LIBS
    ]
    assert not bad, "\n".join(bad)


def test_runners_never_import_the_tui_or_the_front_ends() -> None:
    bad = [
        f"{i.file}:{i.line} imports {i.module}"
        for i in _all(REPO / "runners")
        if i.module.split(".")[0] in UI_LIBS
        or i.module.startswith(("dstui.tui", "dstui.commands", "dstui.execute", "dstui.report"))
    ]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_violation() -> None:
    """The rules above are only worth something if the parser finds imports where they are."""
    imps = _imports(PACKAGE / "execute" / "sink.py")
    assert any(i.module.startswith("dstui.tracking") for i in imps)
    lazy = [i for i in _all(PACKAGE) if not i.top_level and i.module.split(".")[0] == "deepspeed"]
    assert lazy, "deepspeed is imported lazily somewhere in dstui/spec (validation); the walker must see it"


# -- the house rules over every module (tests/unit/code_rules.py) --------------------------------------

@functools.cache
def product() -> dict[str, code_rules.Module]:
    """dstui/ and runners/ parsed once per process, when a test first asks (not at every worker's collection)."""
    return code_rules.load(REPO, ("dstui", "runners"))


def test_no_import_cycle_between_modules() -> None:
    """Function-level imports count (they run, only later); ``if TYPE_CHECKING:`` imports do not."""
    found = code_rules.cycles(product())
    assert not found, "import cycles (move what both need into a module of its own):\n" + "\n".join(found)


def test_no_module_over_450_lines_and_no_function_over_80() -> None:
    found = code_rules.long_modules(product()) + code_rules.long_functions(product())
    assert not found, "split these:\n" + "\n".join(found)


def test_no_private_name_is_used_across_modules() -> None:
    found = code_rules.private_imports(product())
    assert not found, "a name another module needs is public (drop the underscore):\n" + "\n".join(found)


def test_one_import_path_per_name() -> None:
    """No front doors: a name is imported from the module that defines it, by the product, its tests and benchmarks."""
    found = code_rules.reexports({**product(), **code_rules.load(REPO, ("tests", "benchmarks"))})
    assert not found, "import these from where they are defined:\n" + "\n".join(found)


def test_a_run_state_is_written_through_run_status_alone() -> None:
    found = code_rules.state_writers(product())
    assert not found, "\n".join(found)


PLANTED = {
    # a cycle closed by a function-level import; a TYPE_CHECKING import closes none
    "a.py": "from pkg import b\n\n\ndef f():\n    from pkg import c\n    return c\n\n\n_hidden = 1\nthing = 2\n",
    "b.py": "import pkg.a\n",
    "c.py": "from pkg.b import x\n",
    "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n",
    "e.py": "import pkg.d\n",
    # an 81-line function, a 451-line module, a private name used twice over, a front door and its user
    "long.py": "def big():\n" + "    x = 1\n" * 80,
    "huge.py": "x = 1\n" * 451,
    "peek.py": "from pkg.a import _hidden\nfrom pkg import a\n\ny = a._hidden\n",
    "door.py": "from pkg.a import thing\n\n__all__ = ['thing']\n",
    "user.py": "from pkg.door import thing\nfrom pkg import door\n\nz = door.thing\n",
    "writer.py": "def go(rd, merge_status):\n    rd.update_status(state='done')\n    merge_status(rd, {})\n",
}


def test_the_checker_sees_each_planted_violation(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in PLANTED.items():
        (pkg / name).write_text(text)
    mods = code_rules.load(tmp_path, ["pkg"])
    # d <-> e is not one: d's import never runs
    assert code_rules.cycles(mods) == ["pkg.a <-> pkg.b <-> pkg.c: pkg.a:1 imports pkg.b, pkg.a:5 imports pkg.c, "
                                       "pkg.b:1 imports pkg.a, pkg.c:1 imports pkg.b"]  # fmt: skip
    assert code_rules.long_functions(mods) == ["pkg/long.py:1 big: 81 lines"]
    assert code_rules.long_modules(mods) == ["pkg/huge.py: 451 lines"]
    assert code_rules.private_imports(mods) == ["pkg/peek.py:1 imports pkg.a._hidden", "pkg/peek.py:4 uses pkg.a._hidden"]
    assert sorted(code_rules.reexports(mods, attributes_of=("pkg",))) == sorted([
        "pkg/user.py:1 takes thing from pkg.door, which imports it",
        "pkg/door.py:3 __all__ names thing, which it imports",
        "pkg/user.py:4 uses pkg.door.thing, which it imports",
    ])  # fmt: skip
    assert len(code_rules.state_writers(mods)) == 2
