#!/usr/bin/env bash
# setup.sh - install the Debian packages needle-lua needs (when missing) and
# build it. Idempotent: a second run installs nothing and rebuilds only what
# changed. Quiet on success; on failure prints the failing step's full log.
#
#   bash scripts/setup.sh              -> build/       (Release)
#   bash scripts/setup.sh --sanitize   -> build-asan/  (ASan + UBSan, RelWithDebInfo)
#
# Environment: NEEDLE_BUILD_DIR overrides the build directory;
# NEEDLE_CMAKE_ARGS adds arguments to the cmake configure step;
# JOBS sets build parallelism (default: nproc).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

sanitize=0
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option: $a" >&2; exit 2 ;;
  esac
done

# ---- packages -------------------------------------------------------------
packages=(cmake gcc make pkg-config lua5.4 liblua5.4-dev libopenblas-dev libopenblas-openmp-dev dataset-fashion-mnist zlib1g-dev
          libreadline-dev lua-busted luarocks
          # nd.image.read: PNG and JPEG decoding
          libpng-dev libturbojpeg0-dev
          # OpenCL: headers + ICD loader to build the backend, POCL to run it on the CPU (CI)
          ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd clinfo
          # nd.distributed: MPI to build against, mpirun to launch (and the specs)
          libopenmpi-dev openmpi-bin)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  if [ "$status" != "installed" ]; then
    missing+=("$p")
  fi
done

log=$(mktemp "${TMPDIR:-/tmp}/needle-setup.XXXXXX")
trap 'rm -f "$log"' EXIT

# run "description" cmd...: output goes to the log, shown only on failure
run() {
  local what=$1; shift
  if ! "$@" >"$log" 2>&1; then
    echo "setup.sh: FAILED: $what" >&2
    echo "setup.sh: command: $*" >&2
    echo "----------------------------------------------------------------------" >&2
    cat "$log" >&2
    echo "----------------------------------------------------------------------" >&2
    exit 1
  fi
}

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: missing Debian packages: ${missing[*]}" >&2
    echo "setup.sh: install them with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}"
  run "apt-get update" apt-get update
  run "apt-get install ${missing[*]}" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# ---- build ----------------------------------------------------------------
if [ "$sanitize" -eq 1 ]; then
  build_dir=${NEEDLE_BUILD_DIR:-build-asan}
  cmake_args=(-DNEEDLE_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
else
  build_dir=${NEEDLE_BUILD_DIR:-build}
  cmake_args=(-DCMAKE_BUILD_TYPE=Release)
fi
# shellcheck disable=SC2206
extra=(${NEEDLE_CMAKE_ARGS:-})
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

run "cmake configure ($build_dir)" cmake -B "$build_dir" "${cmake_args[@]}" "${extra[@]}"
run "cmake build ($build_dir)" cmake --build "$build_dir" -j"$jobs"
