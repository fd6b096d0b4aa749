"""fleet explain's views: the per-node table, then the chains as explain prints them (same Chain objects)."""

from __future__ import annotations

from typing import IO, Any

from ingero.analyze.model import Report
from ingero.render import json as json_view
from ingero.render import safe
from ingero.render.terminal import span_text, write_chains


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def write(report: Report, nodes: list[dict[str, Any]], out: IO[str]) -> None:
    a = report.analysed
    out.write(f"Fleet: {len(nodes)} node(s) over {span_text((a.end_ns - a.start_ns) / 1e9)}; "
              f"{a.events:,} events, drops: {a.drops_kernel:,} kernel, {a.drops_user:,} user\n")
    out.write(f"  {'node':<20} {'steps':>8} {'step ms':>9} {'CPU wait':>9} {'other cores':>12}  clock\n")
    for n in nodes:
        wait = "-" if n["cpu_wait_share"] is None else f"{n['cpu_wait_share']:.0%}"
        clock = "synced" if n["clock_synced"] else "not synced"
        out.write(f"  {safe.text(n['node']):<20} {n['steps']:>8,} {_ms(n['step_ms']):>9} {wait:>9} "
                  f"{n['others_cores']:>12.2f}  {clock}\n")
    _top_chains(nodes, out)
    write_chains(report, out, "Cross-node Causal Chains:",
                 "No cross-node causal chains: no straggler, no cause shared by several nodes, no busy host.")


def _top_chains(nodes: list[dict[str, Any]], out: IO[str]) -> None:
    """Each node's own strongest chain over the range (findings.top_chain), one or two lines a node."""
    if not nodes:
        return
    out.write("Each node's own top chain:\n")
    for n in nodes:
        c = n.get("top_chain")
        if c is None:
            out.write(f"  {safe.text(n['node'])}: no chain of its own in the range\n")
            continue
        share = f"{c['share']:.0%} of its wall clock, " if c["share"] else ""  # (a notice counts calls: none)
        out.write(safe.text(f"  {n['node']}: [{c['severity']}] {c['title']}   ({share}{c['windows']} of "
                            f"{n['windows']} windows)") + "\n")
        if c["root"]:
            out.write(safe.text(f"  {' ' * len(str(n['node']))}  {c['root'][0]}") + "\n")


def to_dict(report: Report, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """explain --json's shape (format_version, analysed, chains, notes, ...) plus ``nodes``."""
    return json_view._clean({**json_view.to_dict(report), "nodes": nodes})
