#!/bin/sh
# tests/fuzz/run.sh [SECONDS] [TARGET...] - build the libFuzzer harnesses
# (CMake option NEEDLE_FUZZ, clang) in build-fuzz and run each for SECONDS
# (default 60), one after the other, on one core. Every harness starts from
# its committed seeds (tests/fuzz/corpus/<target>) plus what earlier runs
# found (build-fuzz/fuzz/corpus/<target>, not committed); crashes, leaks and
# timeouts are written to build-fuzz/fuzz/artifacts/<target>/. TARGET is
# pickle, safetensors, zip, torch_load or json (default: every one that was built).
# Exit status: 1 when any harness found something. See docs/fuzzing.md.
set -eu
cd "$(dirname "$0")/../.."
secs=${1:-60}
[ $# -gt 0 ] && shift
build=${NEEDLE_FUZZ_BUILD:-build-fuzz}
CC=${CC:-clang} cmake -S . -B "$build" -DNEEDLE_FUZZ=ON -DNEEDLE_OPENCL=OFF \
    -DNEEDLE_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target needle_fuzz -j "${JOBS:-2}"
targets=${*:-"pickle safetensors zip torch_load json"}
status=0
for t in $targets; do
    bin="$build/fuzz/fuzz_$t"
    [ -x "$bin" ] || { echo "fuzz_$t: not built (its reader is missing)"; continue; }
    case $t in
        pickle) dict=tests/fuzz/pickle.dict ;;
        safetensors) dict=tests/fuzz/safetensors.dict ;;
        json) dict=tests/fuzz/json.dict ;;
        *) dict=tests/fuzz/zip.dict ;;
    esac
    work="$build/fuzz/corpus/$t"
    art="$build/fuzz/artifacts/$t"
    mkdir -p "$work" "$art"
    echo "== fuzz_$t for ${secs}s"
    if ! "$bin" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
            -dict="$dict" -artifact_prefix="$art/" -print_final_stats=1 \
            "$work" "tests/fuzz/corpus/$t" 2>"$build/fuzz/$t.log"; then
        status=1
        echo "fuzz_$t: FOUND SOMETHING, see $build/fuzz/$t.log and $art/"
    fi
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
        "$build/fuzz/$t.log" || true
done
exit $status
