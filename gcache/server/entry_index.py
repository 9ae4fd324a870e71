"""The hot tier's key -> entry map, with the bytes of the values it names as a running sum.

STAT (and with it every ``gcache.kv`` pressure reading, once a second per store) asks how many
bytes are live; summing every entry under the tier's lock held up every request of the server
for as long as the sum took (a million objects: tens of milliseconds, every second, per
reader). The sum is kept as entries come and go instead, so STAT is O(1).
"""

from __future__ import annotations

from typing import Generic, NoReturn, Protocol, TypeVar, overload


class Sized(Protocol):
    length: int


E = TypeVar("E", bound=Sized)
T = TypeVar("T")


class EntryIndex(dict[bytes, E], Generic[E]):
    """A dict that changes only by ``index[key] = entry``, ``del index[key]`` and ``pop``,
    which keep ``value_bytes`` equal to the sum of its entries' ``length``."""

    __slots__ = ("value_bytes",)

    def __init__(self) -> None:
        super().__init__()
        self.value_bytes = 0

    def __setitem__(self, key: bytes, entry: E) -> None:
        old = self.get(key)
        if old is not None:
            self.value_bytes -= old.length
        super().__setitem__(key, entry)
        self.value_bytes += entry.length

    def __delitem__(self, key: bytes) -> None:
        self.value_bytes -= self[key].length
        super().__delitem__(key)

    @overload
    def pop(self, key: bytes, /) -> E: ...
    @overload
    def pop(self, key: bytes, default: E, /) -> E: ...
    @overload
    def pop(self, key: bytes, default: T, /) -> E | T: ...
    def pop(self, key: bytes, *default: object) -> object:
        if key in self:
            entry = super().pop(key)
            self.value_bytes -= entry.length
            return entry
        if default:
            return default[0]
        raise KeyError(key)

    def _unsupported(self, *args: object, **kwargs: object) -> NoReturn:
        # builtin on purpose: a bug in our tier, not a bad request (the handler answers those)
        raise TypeError("EntryIndex changes only by [key] = entry, del and pop (they keep "
                        "value_bytes)")

    update = setdefault = popitem = clear = __ior__ = _unsupported
