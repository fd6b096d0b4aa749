"""What `ingero check` prints: a line per check (ok / missing / absent), its fix, the verdict."""

from __future__ import annotations

from typing import Any, Sequence

from ingero.render import safe


def text(results: Sequence[Any], ready: bool) -> str:
    """``results``: check.Check rows (name, ok, required, detail, fix)."""
    width = max(len(c.name) for c in results)
    lines = []
    for c in results:
        mark = "ok     " if c.ok else ("missing" if c.required else "absent ")
        lines.append(f"{mark}  {c.name.ljust(width)}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"         {' ' * width}  fix: {c.fix}")
    lines.append("ready: `sudo ingero trace` can run" if ready else "not ready: fix the lines marked missing")
    # details name files and libraries found on the host (a process's maps): untrusted text
    return "\n".join(safe.text(line) for line in lines)
