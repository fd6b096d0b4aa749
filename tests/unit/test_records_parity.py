"""bpf/events.h and ingero/events/ (records.py, ops.py) must describe the same bytes.

Compiles a tiny C program against events.h that prints sizeof/offsetof of
every mirrored struct and the value of every enum constant, and compares.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ingero.events import ops, records

EVENTS_H = Path(__file__).resolve().parents[2] / "bpf" / "events.h"


def _enum_constants(prefix: str) -> list[str]:
    return re.findall(rf"^\s*({prefix}[A-Z0-9_]+)\s*=", EVENTS_H.read_text(), re.M)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed for the parity test (make setup installs gcc)")
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{EVENTS_H}"', "int main(void) {"]
    for cname, mirror in records.MIRRORS.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, *_ in mirror._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    for prefix in records.ENUM_MIRRORS:
        for const in _enum_constants(prefix):
            lines.append(f'printf("enum {const} %d\\n", (int){const});')
    for name in records.DEFINE_MIRRORS:
        lines.append(f'printf("define {name} %llu\\n", (unsigned long long)({name}));')
    lines.append("return 0; }")
    d = tmp_path_factory.mktemp("parity")
    (d / "p.c").write_text("\n".join(lines))
    subprocess.run([cc, "-Wall", "-Werror", "-o", str(d / "p"), str(d / "p.c")], check=True)
    out = subprocess.run([str(d / "p")], check=True, capture_output=True, text=True).stdout
    return {" ".join(line.split()[:-1]): int(line.split()[-1]) for line in out.splitlines()}


@pytest.mark.parametrize("cname", sorted(records.MIRRORS))
def test_struct_size_and_offsets_match(c_layout: dict[str, int], cname: str) -> None:
    mirror = records.MIRRORS[cname]
    assert c_layout[f"{cname} sizeof"] == ctypes.sizeof(mirror)
    for field, *_ in mirror._fields_:
        assert c_layout[f"{cname} {field}"] == getattr(mirror, field).offset, field


@pytest.mark.parametrize("prefix", sorted(records.ENUM_MIRRORS))
def test_enum_values_match(c_layout: dict[str, int], prefix: str) -> None:
    enum = records.ENUM_MIRRORS[prefix]
    consts = _enum_constants(prefix)
    assert consts, f"no {prefix}* constants found in events.h"
    for const in consts:
        assert enum[const[len(prefix):]] == c_layout[f"enum {const}"], const
    assert {m.name for m in enum} == {c[len(prefix):] for c in consts}


def test_numpy_dtype_is_the_ctypes_layout() -> None:
    assert records.EVENT_DTYPE.itemsize == 56
    assert records.EVENT_DTYPE.names == tuple(f for f, *_ in records.Event._fields_)


def test_every_op_has_a_public_name() -> None:
    assert set(ops.OP_NAMES) == set(ops.Op)
    assert len(set(ops.OP_NAMES.values())) == len(ops.OP_NAMES)


def test_bpf_op_classes_match_the_queued_contract() -> None:
    """bpf/cuda.bpf.c op_class() and ops.ASYNC_OPS / DRAINING_OPS (derive.py's SQL) agree."""
    src = (EVENTS_H.parent / "cuda.bpf.c").read_text()
    body = re.search(r"u8 op_class\(u8 op\)\s*\{(.*?)\n\}", src, re.S)
    assert body, "op_class() not found in cuda.bpf.c"
    classes: dict[str, set[str]] = {}
    pending: list[str] = []
    for token in re.findall(r"case (OP_[A-Z0-9_]+):|return (CLASS_[A-Z]+);", body.group(1)):
        if token[0]:
            pending.append(token[0])
        else:
            classes.setdefault(token[1], set()).update(pending)
            pending = []
    names = {cls: {ops.OP_NAMES[ops.Op[c[3:]]] for c in members} for cls, members in classes.items()}
    assert names["CLASS_ASYNC"] == ops.ASYNC_OPS
    assert names["CLASS_SYNC"] == ops.DRAINING_OPS


def test_switch_row_packing_matches(c_layout: dict[str, int]) -> None:
    for name, value in records.DEFINE_MIRRORS.items():
        assert c_layout[f"define {name}"] == value, name
