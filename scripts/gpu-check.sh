#!/bin/bash
# The first run of ingero on a real GPU, offline: set up what ingero needs from the kit that
# scripts/gpu-check-prepare.sh made (no network there), then run four short PyTorch loops
# (healthy; a num_workers=0 DataLoader with per-item CPU work; CPU hogs on the loop's core;
# pageable host-to-device copies), each under `ingero trace --cmd` with CUPTI and, in a run of
# its own, under torch.profiler, and print one table: CUPTI's busy share against
# torch.profiler's, the share inferred from the calls alone, the top chain (scripts/gpu_check.py).
# Within 8 minutes: loops that would not finish in time are left out (the table says so).
#
#   scripts/gpu-check.sh                  # on the GPU machine, as root, the kit in gpu-kit/
#   scripts/gpu-check.sh --setup-only     # only unpack what the kit holds (a first of two carries)
#   scripts/gpu-check.sh --dry            # here: the same loops on the simulated runtime and its
#                                         # CUPTI stand-in (demos/build), no torch, no GPU
# Options: --kit DIR (gpu-kit), --seconds N per loop (10; dry 2), --out DIR (/tmp/ingero-gpu-check;
# with the device tool's $OUT set, the table and results are copied there), --loops a,b.
#
# Set-up, nothing of the machine's own packages touched: Debian's BCC and its LLVM are unpacked
# into /opt/ingero-kit/root (dpkg-deb -x, not dpkg -i) and reached through PYTHONPATH and
# LD_LIBRARY_PATH; the kernel headers into /opt/ingero-kit/kheaders (BCC_KERNEL_SOURCE), unless
# ingero finds some of the machine's own; the wheels into /opt/ingero-kit/site, only for modules
# the machine's python lacks; ingero runs from this working tree.
set -uo pipefail
export INGERO_GPU_CHECK_T0=${INGERO_GPU_CHECK_T0:-$(date +%s.%N)}
cd "$(dirname "$0")/.."
REPO=$(pwd)
KIT=gpu-kit DRY=0 SETUP_ONLY=0 SECS="" OUTDIR=/tmp/ingero-gpu-check LOOPS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry) DRY=1 ;;
        --setup-only) SETUP_ONLY=1 ;;
        --kit) KIT=$2; shift ;;
        --seconds) SECS=$2; shift ;;
        --out) OUTDIR=$2; shift ;;
        --loops) LOOPS=$2; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
say() { echo "gpu-check: $*" >&2; }
die() { echo "gpu-check: $*" >&2; exit 2; }
args=(--out "$OUTDIR")
[ -n "$LOOPS" ] && args+=(--loops "$LOOPS")

finish() {  # the table and results, also where the device tool fetches files from
    local rc=$1
    if [ -n "${OUT:-}" ] && [ -d "$OUTDIR" ]; then
        cp "$OUTDIR"/table.md "$OUTDIR"/results.json "$OUT"/ 2>/dev/null || true
        tar -C "$OUTDIR" -czf "$OUT/logs.tar.gz" --exclude='*.duckdb*' . 2>/dev/null || true
    fi
    exit "$rc"
}

if [ "$DRY" -eq 1 ]; then
    PY=${PYTHON:-$REPO/.venv/bin/python}
    [ -x "$PY" ] || PY=python3
    make -s -C demos >/dev/null || die "make -C demos failed: the simulated runtime is needed"
    [ -e demos/build/libcupti.so.13 ] || die "no CUPTI stand-in (demos/build/libcupti.so.13): the CUDA toolkit's cupti.h is needed to build it"
    "$PY" scripts/gpu_check.py --dry --seconds "${SECS:-2}" "${args[@]}"
    finish $?
fi

[ "$(id -u)" -eq 0 ] || die "run as root (eBPF)"
PY=${PYTHON:-python3}
PREFIX=/opt/ingero-kit
mkdir -p "$PREFIX"
if [ "$SETUP_ONLY" -eq 0 ]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null ||
        die "$PY has no PyTorch that sees a GPU (PYTHON=... names another interpreter)"
fi

# --- BCC -----------------------------------------------------------------------------------
if ! "$PY" -c "import bcc" 2>/dev/null; then
    if ls "$KIT"/debs/*.deb >/dev/null 2>&1; then
        for deb in "$KIT"/debs/*.deb; do
            stamp="$PREFIX/.$(basename "$deb").unpacked"
            [ -f "$stamp" ] || { dpkg-deb -x "$deb" "$PREFIX/root" && touch "$stamp"; } || die "cannot unpack $deb"
        done
        say "BCC unpacked from $KIT/debs into $PREFIX/root"
    fi
    export PYTHONPATH="$PREFIX/root/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
    export LD_LIBRARY_PATH="$PREFIX/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    lib=$PREFIX/root/usr/lib/x86_64-linux-gnu/libbcc.so.0
    if [ -e "$lib" ]; then
        missing=$(ldd "$lib" | awk '/not found/ {print $1}' | tr '\n' ' ')
        [ -z "$missing" ] || die "libbcc needs libraries this machine lacks: $missing(add their Debian packages to $KIT/debs)"
    fi
fi

# --- kernel headers ------------------------------------------------------------------------
if [ -f "$KIT/kheaders.tar.xz" ] && [ ! -f "$PREFIX/kheaders/.unpacked" ]; then
    mkdir -p "$PREFIX/kheaders" && tar -C "$PREFIX/kheaders" -xJf "$KIT/kheaders.tar.xz" &&
        touch "$PREFIX/kheaders/.unpacked" || die "cannot unpack $KIT/kheaders.tar.xz"
fi

# --- wheels ----------------------------------------------------------------------------------
if ls "$KIT"/wheels/*.whl >/dev/null 2>&1; then
    if ! "$PY" -c "import duckdb, elftools" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PREFIX/site" \
            "$KIT"/wheels/*.whl || die "pip could not install $KIT/wheels"
    fi
fi
[ -d "$PREFIX/site" ] && export PYTHONPATH="$PREFIX/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [ "$SETUP_ONLY" -eq 1 ]; then
    say "set up in $PREFIX: $(ls "$PREFIX" | tr '\n' ' ')"
    exit 0
fi

"$PY" -c "import bcc, duckdb, elftools, pyarrow, numpy, click, rich, psutil" ||
    die "still missing Python modules (above): carry the kit's debs and wheels (scripts/gpu-check-prepare.sh)"
# the machine's own kernel headers first; else the kit's
if ! "$PY" -c "from ingero.collect.kheaders import find_kernel_headers as f; f(build=False)" 2>/dev/null; then
    [ -d "$PREFIX/kheaders/include" ] || die "no kernel headers here, and none in the kit ($KIT/kheaders.tar.xz)"
    export BCC_KERNEL_SOURCE=$PREFIX/kheaders
fi
# ingero builds its CUPTI injection library here when it can; else the kit's
if [ -z "$("$PY" -c "from ingero.collect import cupti_inject as c; print(c.library().path or '')" 2>/dev/null)" ]; then
    [ -f "$KIT/lib/libingero_cupti.so" ] && export INGERO_CUPTI_INJECTION="$(cd "$KIT/lib" && pwd)/libingero_cupti.so"
fi
say "$("$PY" -m ingero --version 2>&1 | head -1); torch $("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -m ingero check 2>&1 | sed 's/^/  /' >&2
"$PY" scripts/gpu_check.py --python "$PY" --seconds "${SECS:-10}" "${args[@]}"
finish $?
