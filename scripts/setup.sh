#!/bin/bash
# Idempotent set-up for ingero on Debian/Ubuntu: system packages (BCC, kernel
# headers, a C compiler), a venv that imports Debian's bcc, the Python
# dependencies, the simulated CUDA runtime, and a launcher on root's PATH.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
SYS_PY=/usr/bin/python3   # Debian's python: the one python3-bpfcc installs bcc for

say() { echo "setup: $*"; }

# --- system packages ----------------------------------------------------------
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
. /etc/os-release
if [ "${ID:-}" = "ubuntu" ]; then headers="linux-headers-$(uname -r)"; else headers="linux-headers-$arch"; fi
# openjdk-17-jre-headless: Java for pyspark (the fleet dataset's Spark test, tests/live/test_fleet_spark.py)
want=(python3-bpfcc libbpfcc python3-venv python3-dev gcc make chromium prometheus openjdk-17-jre-headless "$headers")
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing Debian packages: ${missing[*]}" >&2
        echo "setup: run as root: sudo make setup" >&2
        exit 2
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if ! apt-get install -y -qq "${missing[@]}" >/tmp/ingero-apt.log 2>&1; then
        # Ubuntu may lack headers for a custom kernel: fall back to the generic ones.
        if [ "${ID:-}" = "ubuntu" ]; then apt-get install -y -qq linux-headers-generic >>/tmp/ingero-apt.log 2>&1 || true; fi
        tail -5 /tmp/ingero-apt.log >&2
        for p in "${missing[@]}"; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || \
                { [[ "$p" == linux-headers-* ]] || { echo "setup: could not install $p" >&2; exit 2; }; }
        done
    fi
fi

# --- virtualenv ---------------------------------------------------------------
if ! "$VENV/bin/python" -c "import bcc" 2>/dev/null; then
    say "creating $VENV (with system site-packages, for Debian's bcc)"
    rm -rf "$VENV"
    "$SYS_PY" -m venv --system-site-packages "$VENV"
fi
stamp="$VENV/.ingero-deps"
# setup.py and ingero/export/_wire.c: the export's C part, built by this install (editable: in place)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ ingero/export/_wire.c -nt "$stamp" ]; then
    say "installing Python dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
    "$VENV/bin/python" -c "import duckdb, pyarrow, numpy, click, rich, psutil, bcc" 
    touch "$stamp"
fi

# --- simulated CUDA runtime for the demos ---------------------------------------
if [ -f demos/Makefile ]; then
    make -s -C demos
fi

# --- CUDA toolkit (optional): the static-runtime live tests build with its nvcc -------
# The same search as tests/live/test_static_runtime.py: $NVCC, nvcc on PATH, else the newest
# /usr/local/cuda*/bin/nvcc.  Not installed here (several GB); under CI those tests fail without it.
nvcc_path=${NVCC:-$(command -v nvcc || true)}
if [ -z "$nvcc_path" ]; then
    nvcc_path=$(ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null | sort -V | tail -1 || true)
fi
if [ -n "$nvcc_path" ] && [ -x "$nvcc_path" ]; then
    say "CUDA toolkit: $nvcc_path ($("$nvcc_path" --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p'))"
else
    say "no CUDA toolkit (nvcc) found: tests/live/test_static_runtime.py needs one (skipped locally, failed under CI)"
fi

# --- launcher so that `sudo ingero ...` finds it (sudo's secure_path has /usr/local/bin)
if [ "$(id -u)" -eq 0 ]; then
    if [ "$(readlink /usr/local/bin/ingero 2>/dev/null)" != "$VENV/bin/ingero" ]; then
        ln -sf "$VENV/bin/ingero" /usr/local/bin/ingero
        say "linked /usr/local/bin/ingero -> $VENV/bin/ingero"
    fi
fi
say "ready ($("$VENV/bin/ingero" --version))"
