"""YAML read within bounds: aliases, nesting and the size aliases expand to (issue 40.5).

A spec is untrusted input. YAML's aliases let a few hundred bytes stand for
billions of values (a 514-byte spec became 1.35 GB of run folders; a 599-byte one
passed 4 GiB), and deep nesting overflowed PyYAML's recursive composer into a
2,999-line traceback. Both YAML libraries dstui uses compose a document node by
node, so each gets a composer that counts as it goes and stops at the first
limit passed, before anything is built:

* at most :data:`MAX_ALIASES` aliases (``*name``; a merge ``<<: *name`` is one);
* at most :data:`MAX_DEPTH` levels of nesting;
* at most :data:`MAX_NODES` values once every alias is counted as the values it
  stands for (a billion-laughs document passes this after a few dozen aliases).

PyYAML (:func:`load`) reads every spec; ruamel.yaml (:func:`bound_round_trip`)
reads the user's file again when Compose saves it with its comments kept.
Passing a limit is a :class:`~dstui.core.errors.SpecError` of one line naming
the limit and where in the file it was passed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from dstui.core.errors import SpecError

MAX_ALIASES = 100
MAX_DEPTH = 50
MAX_NODES = 100_000


class SpecLimit(SpecError):
    """A spec refused for passing a limit (not for being invalid YAML)."""


class LimitPassed(yaml.YAMLError):
    """A document passed one of the limits; ``line`` is 1-based, None when unknown."""

    def __init__(self, what: str, line: int | None) -> None:
        super().__init__(what)
        self.what = what
        self.line = line


class Budget:
    """What one document has used so far: aliases, the current depth, values counted with their aliases."""

    def __init__(self) -> None:
        self.aliases = 0
        self.depth = 0
        self.nodes = 0
        self.sizes: dict[int, int] = {}  # id(node) -> the values it stands for, itself included

    def compose(self, is_alias: bool, mark: Any, compose: Callable[[], Any]) -> Any:
        """Compose one node through ``compose`` (the library's own), counting it against the limits."""
        line = mark.line + 1 if mark is not None else None
        if is_alias:
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise LimitPassed(f"uses more than {MAX_ALIASES} aliases (*name)", line)
            node = compose()
            self._count(self.sizes.get(id(node), 1), line)
            return node
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise LimitPassed(f"nests deeper than {MAX_DEPTH} levels", line)
        start = self.nodes
        self._count(1, line)
        node = compose()
        self.depth -= 1
        self.sizes[id(node)] = self.nodes - start
        return node

    def _count(self, n: int, line: int | None) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise LimitPassed(f"stands for more than {MAX_NODES:,} values once its aliases are expanded", line)


def _flow_nesting(flow_level: int, mark: Any) -> None:
    """Nested flow collections (``[[[[...``) are refused as the scanner meets them.

    Waiting for the composer would cost a second or more: before its first token
    the scanner looks up to 1,024 characters ahead for a ``:`` that would make each
    ``[`` a key, at a cost that grows with the nesting it holds open.
    """
    if flow_level > MAX_DEPTH:
        raise LimitPassed(f"nests deeper than {MAX_DEPTH} levels", mark.line + 1)


class BoundedSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing within :class:`Budget`'s limits."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.budget = Budget()

    def fetch_flow_collection_start(self, *args: Any) -> None:
        super().fetch_flow_collection_start(*args)
        _flow_nesting(self.flow_level, self.get_mark())

    def compose_node(self, parent: Any, index: Any) -> Any:
        is_alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        return self.budget.compose(is_alias, mark, lambda: super(BoundedSafeLoader, self).compose_node(parent, index))


def load(text: str, *, file: str | None = None) -> Any:
    """The YAML document in ``text``, read within the limits; SpecError (one line) when it is not YAML or passes one."""
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader
    except LimitPassed as e:
        raise limit_error(e, file) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = str(getattr(e, "problem", None) or e).split("\n")[0]  # one line, whatever PyYAML says
        raise SpecError(f"invalid YAML{where}: {' '.join(what.split())}", file=file) from None


def limit_error(e: LimitPassed, file: str | None) -> SpecLimit:
    where = f" (at line {e.line})" if e.line else ""
    return SpecLimit(f"refused: the YAML {e.what}{where}", file=file)


def bound_round_trip(rt: Any) -> Any:
    """A ruamel.yaml ``YAML()`` instance whose composer keeps the same limits (it is returned).

    Passing one raises :class:`LimitPassed` out of ``rt.load``; :func:`limit_error` makes it a SpecError.
    """
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.events import AliasEvent

    class BoundedComposer(Composer):
        def __init__(self, loader: Any = None) -> None:
            super().__init__(loader)
            self.budget = Budget()

        def compose_document(self) -> Any:
            self.budget = Budget()  # ruamel keeps one composer per YAML(): each document starts afresh
            return super().compose_document()

        def compose_node(self, parent: Any, index: Any) -> Any:
            is_alias = self.parser.check_event(AliasEvent)
            mark = self.parser.peek_event().start_mark
            return self.budget.compose(is_alias, mark, lambda: super(BoundedComposer, self).compose_node(parent, index))

    class BoundedScanner(rt.Scanner):  # the scanner this YAML() was made with (round trip, safe, ...)
        def fetch_flow_collection_start(self, *args: Any, **kwargs: Any) -> None:
            super().fetch_flow_collection_start(*args, **kwargs)
            _flow_nesting(self.flow_level, self.reader.get_mark())

    rt.Composer = BoundedComposer
    rt.Scanner = BoundedScanner
    return rt
