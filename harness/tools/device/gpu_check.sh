#!/bin/bash
# The checks that need a real GPU, as one short script for a machine with an NVIDIA GPU and no
# network (the device machine a task may be lent; see harness/tools/device/README.md):
#   bash harness/tools/device/gpu_check.sh [OUT_DIR]
# It installs the SDK and the agent into the interpreter that has psutil and requests (no
# index: pyseccomp and, where the system lacks it, libseccomp come from .whl/), prints what the
# agent's own GPU detection and the sandbox's walls find on this kernel, then runs the
# `gpu-real` scenario (harness/e2e/scenarios/gpu_real.py) on the local backend, as an ordinary user
# when started as root (user oarbank-gpu, made if missing). Exit 0 only if the scenario passed.
set -u
out=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
echo "== machine"; uname -r; nvidia-smi -L 2>&1 | head -4; "$py" --version
if ! ldconfig -p | grep -q 'libseccomp.so.2 '; then
    echo "== libseccomp.so.2 missing: unpacking the carried .deb"
    for f in .whl/libseccomp2_*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
echo "== install (no index)"
"$py" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    ./sdk ./agent .whl/pyseccomp-*.whl || exit 3
bin=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
echo "== the agent's GPU detection"
"$py" -m oarbank_agent.host.gpuapis | tee "$out/gpu-detection.json"
echo "== the sandbox's walls on this kernel"
"$py" -c 'import json; from oarbank_sdk import sandbox; print(json.dumps(sandbox.capabilities(), indent=1))' \
    | tee "$out/sandbox-walls.json"
echo "== gpu-real"
if [ "$(id -u)" = 0 ]; then
    # A root agent's children may not write /proc, which CUDA's driver needs (the agent says so
    # at load): run the node as an ordinary user, from a copy of the tree that user can read.
    user=oarbank-gpu
    id -u "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
    tree=$(mktemp -d /tmp/oarbank-gpu-tree.XXXXXX)
    cp -a harness examples "$tree/" && chmod -R a+rX "$tree"
    runs=$(mktemp -d /tmp/oarbank-gpu-out.XXXXXX) && chown "$user" "$runs"
    (cd "$tree" && setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups \
        env HOME=/tmp PATH="$bin:$PATH" PYTHONUNBUFFERED=1 \
        "$py" -m harness --backend local --scenario gpu-real --out "$runs")
    rc=$?
    mkdir -p "$out/e2e" && cp -a "$runs/." "$out/e2e/"  # $out may be in root's home
    rm -rf "$tree" "$runs"
else
    PATH="$bin:$PATH" PYTHONUNBUFFERED=1 "$py" -m harness --backend local --scenario gpu-real \
        --out "$out/e2e"
    rc=$?
fi
# Every log of the run in one file (the node folders are deep, the daemon's log is its service's).
find "$out/e2e/runs" -name '*.log' -size +0 2>/dev/null | sort | while read -r f; do
    echo "=== $f"; tail -c 20000 "$f"
done > "$out/logs.txt"
cat "$out/e2e/report.md" 2>/dev/null | tail -40
exit $rc
