"""JSON values that cannot be changed: what a snapshot hands to the UI thread (no textual here).

A snapshot's statuses are shared by every screen that renders them and by the
next snapshot (an unchanged file is not parsed again), so a screen that wrote
into one would corrupt what the others show. ``freeze`` makes parsed JSON
read-only all the way down while keeping its types' behaviour for readers: a
frozen dict is still a ``dict`` (``isinstance`` checks, ``.get``, ``{**d}``,
``json.dumps`` work), a frozen list still a ``list``; only their mutators raise.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(f"a snapshot's {type(self).__mro__[1].__name__} is read-only: copy it to change it")


class FrozenDict(dict):
    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))

    def __copy__(self) -> dict:
        return dict(self)

    def __reduce__(self):  # noqa: ANN204 - pickled/deep-copied as a plain dict
        return (dict, (dict(self),))


class FrozenList(list):
    __slots__ = ()
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = _refuse  # type: ignore[assignment]
    __iadd__ = __imul__ = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self):  # noqa: ANN204
        return (list, (list(self),))


def freeze(value: Any) -> Any:
    """Parsed JSON (dicts, lists, scalars) made read-only, recursively."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value
