#!/usr/bin/env bash
# One-shot set-up on a fresh Debian/Ubuntu machine (root or sudo): system FUSE packages, the venvs, the
# package with its test extra. With --demo it then runs the main job on a generated demo checkpoint.
#   sudo bash scripts/setup.sh --demo
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

log() { printf '\n== %s\n' "$*"; }

install_system_packages() {
    if ! command -v apt-get >/dev/null; then
        echo "setup: apt-get not found; install fuse3, libfuse3 and libfuse2 with your package manager" >&2
        return
    fi
    log "system packages (FUSE, Python venv)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # Ubuntu 24.04 renamed libfuse2 to libfuse2t64.
    local fuse2=libfuse2
    if ! apt-cache show libfuse2 >/dev/null 2>&1 && apt-cache show libfuse2t64 >/dev/null 2>&1; then
        fuse2=libfuse2t64
    fi
    # gcc + python3-dev build the optional C dequantization kernels (without them numpy is used).
    $SUDO apt-get install -y -qq fuse3 libfuse3-3 "$fuse2" python3 python3-venv python3-pip \
        gcc python3-dev attr util-linux coreutils >/dev/null
    # Debian's udev rule makes /dev/fuse 0666 so that users can mount; some containers and VMs leave 0600.
    if [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
        $SUDO chmod 0666 /dev/fuse || true
    fi
}

make_venv() {  # make_venv DIR PIP-ARGS...
    local dir=$1; shift
    if [ ! -x "$dir/bin/python" ]; then
        python3 -m venv "$dir"
    fi
    "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$dir/bin/python" -m pip install -q "$@"
}

install_system_packages
log "venv .venv (numpy 2.x) with ckptfs and its test extra"
make_venv "$ROOT/.venv" -e "$ROOT[test]"
log "venv .venv-np1 (numpy 1.26) for the dequantization tests"
make_venv "$ROOT/.venv-np1" "numpy==1.26.*" -e "$ROOT[test]"

if [ "${1:-}" = "--demo" ]; then
    log "demo: generate a small mixed-type GGUF, mount it, list it, load a tensor"
    "$ROOT/.venv/bin/python" scripts/demo.py
fi
