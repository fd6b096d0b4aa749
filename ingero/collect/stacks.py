"""--stack: turn the ids bpf/stack.h puts in events into rows of ``stacks``.

Kernel side (bpf/stack.h): ``ingero_stack_id(ctx)`` stores one record per
distinct call site in the BPF hash ``ingero_stacks`` -- the native user stack
id plus, for CPython processes, the (code object, instruction pointer) of
every Python frame of the thread -- and returns the record's 31-bit content
hash.  User space (this module):

* ``StackResolver.prepare(pids)`` finds each process's interpreter
  (pyframes.find_interpreter) and writes its layout into ``ingero_py_procs``;
* ``StackResolver.resolve(stack_ids, pids)`` turns BPF ids into stored stack
  ids: each BPF record is read once, symbolised (symbols.py for native
  frames, pyframes.CodeReader for Python frames: file, line being executed,
  source text), hashed by content into a 63-bit ``stack_id`` and appended to
  ``stacks`` once.

BCC rewrites map calls (``m.lookup(k)``) only in the main source file, not in
included headers, so a program using stack.h must be compiled from
``bpf_text(path)``, which inlines ``#include "stack.h"``.
"""

from __future__ import annotations

import ctypes
import hashlib
import linecache
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
STACK_HEADER = "stack.h"
# Must equal INGERO_PY_MAX_FRAMES in bpf/stack.h (checked by tests/unit/test_pyframes.py).
PY_MAX_FRAMES = 48

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def bpf_text(main: Path | str, *, inline: tuple[str, ...] = (STACK_HEADER,)) -> str:
    """Source of ``main`` with ``#include "stack.h"`` replaced by the header's text.

    BCC only rewrites BPF map method calls found in the main file; the
    ``#line`` markers keep compiler messages pointing at the real files.
    """
    main = Path(main)
    out: list[str] = []
    for lineno, line in enumerate(main.read_text().splitlines(), 1):
        m = _INCLUDE_RE.match(line)
        if m and m.group(1) in inline:
            header = BPF_DIR / m.group(1)
            if not header.exists():
                header = main.parent / m.group(1)
            out.append(f'#line 1 "{header}"')
            out.extend(header.read_text().splitlines())
            out.append(f'#line {lineno + 1} "{main}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"
