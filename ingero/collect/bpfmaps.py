"""Operations on BPF maps shared by the loader and the stack resolver.

Its own module so that loader.py (which compiles stack.h through stacks.py)
and stacks.py (which deletes resolved records) both import it without
importing each other.
"""

from __future__ import annotations

from typing import Any


def discard(table: Any, key: Any) -> None:
    """Delete ``key`` from a BPF map if it is there.

    Not ``table.pop(key, None)``: MutableMapping.pop looks the key up, then
    deletes it, and another thread may delete it in between (stacks.py's
    watcher drain and flush both delete resolved stacks): BCC's __delitem__
    then raised KeyError out of the flush and ended the trace (seen in CI,
    test_retention_stacks_live, 2026-11-23).  The kernel's delete is atomic:
    ENOENT means someone else was first."""
    try:
        del table[key]
    except KeyError:
        pass
