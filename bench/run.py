"""`make bench`: run every bench/bench_*.py in turn and print their tables.

Each benchmark is a standalone module printing a markdown table; this runner
only sequences them (one at a time: they measure the same two cores) and
reports which failed.  Results go to stdout and bench-results/<name>.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "bench-results"


def main(argv: list[str]) -> int:
    wanted = set(argv)
    OUT.mkdir(exist_ok=True)
    failed = []
    for path in sorted(HERE.glob("bench_*.py")):
        name = path.stem
        if wanted and name not in wanted and name.removeprefix("bench_") not in wanted:
            continue
        print(f"\n## {name}\n", flush=True)
        t0 = time.monotonic()
        result = subprocess.run([sys.executable, "-m", f"bench.{name}"], cwd=HERE.parent,
                                capture_output=True, text=True)
        sys.stdout.write(result.stdout)
        (OUT / f"{name}.md").write_text(result.stdout)
        if result.returncode != 0:
            failed.append(name)
            sys.stdout.write(f"\n{name} FAILED (exit {result.returncode}):\n{result.stderr[-2000:]}\n")
        print(f"\n({name}: {time.monotonic() - t0:.1f} s)", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
