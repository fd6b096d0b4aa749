"""loader.discard: deleting a resolved stack from the BPF map when another thread may delete it first.

The watcher thread's early drain and the flush's resolve both delete the
records they resolved.  ``MutableMapping.pop(key, None)`` (what stacks.py used)
looks up, then deletes; a delete in between made BCC's __delitem__ raise
KeyError out of the flush, which ended the trace (CI, 2026-11-23).
"""

from __future__ import annotations

from collections.abc import MutableMapping

import pytest

from ingero.collect.loader import discard


class BccLikeTable(MutableMapping):
    """A map with BCC's behaviour: deleting a missing key raises KeyError (ENOENT).
    ``deleted_by_other`` keys vanish between a lookup and the next delete."""

    def __init__(self, items: dict[int, str]):
        self.items_ = dict(items)
        self.deleted_by_other: set[int] = set()

    def __getitem__(self, key: int) -> str:
        value = self.items_[key]
        if key in self.deleted_by_other:
            del self.items_[key]  # the other thread's delete lands right after our lookup
        return value

    def __delitem__(self, key: int) -> None:
        if key not in self.items_:
            raise KeyError(key)
        del self.items_[key]

    def __setitem__(self, key: int, value: str) -> None:
        self.items_[key] = value

    def __iter__(self):
        return iter(list(self.items_))

    def __len__(self) -> int:
        return len(self.items_)


def test_the_race_that_ended_the_trace_is_real_with_pop():
    table = BccLikeTable({7: "stack"})
    table.deleted_by_other.add(7)
    with pytest.raises(KeyError):
        table.pop(7, None)


def test_discard_deletes_a_present_key_and_only_it():
    table = BccLikeTable({7: "a", 8: "b"})
    discard(table, 7)
    assert dict(table.items_) == {8: "b"}


def test_discard_of_a_key_another_thread_deleted_first_is_silent():
    table = BccLikeTable({7: "a"})
    table.deleted_by_other.add(7)
    table[7]  # our lookup; the other thread deletes right after it
    discard(table, 7)
    discard(table, 9)  # never there
    assert table.items_ == {}

