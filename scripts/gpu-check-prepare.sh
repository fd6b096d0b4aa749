#!/bin/bash
# Prepare, here (network, root, BCC installed: `make setup`), what scripts/gpu-check.sh needs on a
# GPU machine that has PyTorch and root but no network:
#
#   KIT/debs/     Debian bookworm's BCC (python3-bpfcc, libbpfcc) and the LLVM it links
#                 (libllvm14, libclang-cpp14): unpacked there into a private prefix, never dpkg -i
#   KIT/kheaders.tar.xz
#                 the kernel headers BCC's compile of ingero's programs reads, and only those
#                 (found by compiling them here under an LD_PRELOAD shim that logs every open:
#                 ~150 files, ~0.25 MB, against ~12 MB of Debian's linux-headers packages)
#   KIT/wheels/   duckdb and pyelftools for CPython 3.12 (the GPU image's PyTorch python: it has
#                 numpy, pyarrow, click, rich, psutil, nvidia-ml-py already)
#   KIT/lib/libingero_cupti.so
#                 ingero's CUPTI injection library built here against CUDA 13's CUPTI headers,
#                 for a machine that cannot build it (no compiler or headers there)
#
# KIT defaults to gpu-kit/ in the repository root (.gitignore'd: the device tool carries ignored
# paths it is told to, `carry: ["gpu-kit"]`).  The kit and the working tree travel together
# and must stay under 64 MiB: the script prints their sizes and says when they do not fit.
#
#   sudo scripts/gpu-check-prepare.sh            # -> gpu-kit/
#   sudo scripts/gpu-check-prepare.sh /tmp/kit
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
KIT=${1:-gpu-kit}
PY=${PYTHON:-$REPO/.venv/bin/python}
PY_TARGET=${GPU_PYTHON_VERSION:-3.12}   # the GPU image's python (KINDS.md: Python 3.12.3)
LIMIT=$((64 * 1024 * 1024))

say() { echo "gpu-check-prepare: $*"; }
die() { echo "gpu-check-prepare: $*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "run as root (BCC compiles ingero's programs to find the headers they read)"
"$PY" -c "import bcc, duckdb" 2>/dev/null || die "$PY cannot import bcc and duckdb: run make setup first"
command -v apt-get >/dev/null || die "apt-get is needed to download the Debian packages"
mkdir -p "$KIT/debs" "$KIT/wheels" "$KIT/lib"

# --- BCC and its LLVM, as Debian bookworm builds them ------------------------------------
say "downloading BCC's Debian packages into $KIT/debs"
(cd "$KIT/debs" && rm -f ./*.deb && apt-get download -q python3-bpfcc libbpfcc libclang-cpp14 libllvm14 >/dev/null)

# --- the kernel headers BCC reads --------------------------------------------------------
say "compiling ingero's BPF programs under an open() logger to find the kernel headers they read"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -shared -fPIC -O2 -o "$work/openlog.so" scripts/gpu_check_openlog.c -ldl
headers=$("$PY" -c "from ingero.collect.kheaders import find_kernel_headers; print(find_kernel_headers().path)")
for args in "--duration 1s" "--duration 1s --stack"; do
    # (BCC compiles with the header tree as its working directory: the paths it opens are relative)
    LD_PRELOAD="$work/openlog.so" OPENLOG_FILE="$work/opened" \
        "$PY" -m ingero trace --no-serve --db "$work/t.duckdb" $args --cmd true >/dev/null 2>&1 ||
        die "ingero trace failed here: run it by hand to see why"
    rm -f "$work"/t.duckdb*
done
LD_PRELOAD="$work/openlog.so" OPENLOG_FILE="$work/opened" "$PY" -m ingero check >/dev/null 2>&1 || true
(cd "$headers" && grep -v '^/' "$work/opened" | sed 's#^\(\./\)*##' | sort -u | while read -r f; do
    if [ -f "$f" ]; then echo "$f"; fi; done) > "$work/files"
[ -s "$work/files" ] || die "no kernel header was read from $headers: is it the tree BCC uses?"
tar -C "$headers" -chf - -T "$work/files" | xz -9 > "$KIT/kheaders.tar.xz"
say "$(wc -l < "$work/files") header files from $headers -> $KIT/kheaders.tar.xz"

# --- wheels for the GPU image's python -----------------------------------------------------
duckdb_version=$("$PY" -c "import duckdb; print(duckdb.__version__)")
elftools_version=$("$PY" -c "from importlib.metadata import version; print(version('pyelftools'))")
say "downloading duckdb $duckdb_version and pyelftools $elftools_version for CPython $PY_TARGET"
rm -f "$KIT/wheels"/*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_TARGET" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$KIT/wheels" "duckdb==$duckdb_version" "pyelftools==$elftools_version"

# --- the CUPTI injection library, prebuilt ------------------------------------------------------
lib=$("$PY" -c "from ingero.collect import cupti_inject as c; b = c.library(); print(b.path or '')")
if [ -n "$lib" ]; then
    cp "$lib" "$KIT/lib/libingero_cupti.so"
    say "CUPTI injection library -> $KIT/lib/libingero_cupti.so"
else
    say "no CUPTI injection library built here (no CUPTI headers): gpu-check.sh builds it there if it can"
fi

# --- does it travel? ---------------------------------------------------------------------------
kit_bytes=$(du -sb "$KIT" | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((kit_bytes + tree_bytes))
say "kit $((kit_bytes / 1048576)) MiB + working tree $((tree_bytes / 1048576)) MiB = $((total / 1048576)) MiB" \
    "(the device tool carries at most 64 MiB)"
if [ "$KIT" = gpu-kit ] && [ "$total" -gt "$LIMIT" ]; then
    say "too big for one call: carry gpu-kit/debs and gpu-kit/kheaders.tar.xz with 'scripts/gpu-check.sh --setup-only'" \
        "first, then gpu-kit/wheels and gpu-kit/lib with 'scripts/gpu-check.sh' (the machine keeps /opt/ingero-kit while warm)"
fi
