#!/usr/bin/env bash
# test.sh - the whole test suite, as run by CI (.ci/run):
#
#   1. scripts/setup.sh            packages + Release build in build/
#   2. busted specs                build/needle-lua spec/run.lua
#   3. C tests                     ctest in build/
#   unless --quick:
#   4. scripts/setup.sh --sanitize ASan + UBSan build in build-asan/
#   5. busted specs again          build-asan/needle-lua spec/run.lua, leak checks on
#                                  (ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:
#                                   allocator_may_return_null=1:intercept_tls_get_addr=0,
#                                   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
#   6. C tests again               ctest in build-asan/
#
#   bash scripts/test.sh [--quick] [-- busted arguments]
#
# The output ends with exactly one line "N passed, N failed" (", N skipped"
# when busted specs were pending or C tests skipped), summing every stage. A
# stage that crashes, or fails without a count (a build error, a sanitizer
# abort, a leak report at exit), counts as one failure, never as zero. The exit
# status is 0 only when nothing failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$(pwd)

quick=0
busted_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --) shift; busted_args=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option: $1 (busted arguments go after --)" >&2; exit 2 ;;
  esac
  shift
done

jobs=$(nproc 2>/dev/null || echo 2)
logdir=$(mktemp -d "${TMPDIR:-/tmp}/needle-test.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

passed=0
failed=0
skipped=0
report=()   # one line per stage, printed before the final total

note() { report+=("$1"); }

banner() {
  echo
  echo "==== $* ===="
}

# ---- stages -------------------------------------------------------------------

# setup <label> [--sanitize]; returns non-zero when the build failed
stage_setup() {
  local label=$1 dir=$2; shift 2
  banner "setup: $label"
  if NEEDLE_BUILD_DIR=$dir bash scripts/setup.sh "$@"; then
    note "stage setup[$label]: ok"
    return 0
  fi
  failed=$((failed + 1))
  note "stage setup[$label]: FAILED (counted as 1 failure; its tests did not run)"
  return 1
}

# specs <label> <build dir> [env assignments...]
stage_specs() {
  local label=$1 dir=$2; shift 2
  local log="$logdir/specs-$label.log"
  banner "busted specs: $label ($dir/needle-lua spec/run.lua)"
  if [ ! -x "$dir/needle-lua" ]; then
    failed=$((failed + 1))
    note "stage specs[$label]: FAILED: $dir/needle-lua missing (counted as 1 failure)"
    return
  fi
  env "$@" NEEDLE_BUILD_DIR="$dir" NEEDLE_LUA="$root/$dir/needle-lua" \
    "$dir/needle-lua" spec/run.lua "${busted_args[@]}" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  # "12 successes / 1 failure / 0 errors / 2 pending : 1.5 seconds" (plainTerminal
  # and utfTerminal; colour codes stripped). The last such line wins.
  local line
  line=$(sed 's/\x1b\[[0-9;]*m//g' "$log" |
         grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' |
         tail -n 1)
  if [ -z "$line" ] && grep -qE '^1\.\.[0-9]+$' "$log"; then
    # busted -o TAP (passed after --): count the result lines instead
    local ok notok skip
    ok=$(grep -cE '^ok [0-9]+ ' "$log" || true)
    skip=$(grep -cE '^ok [0-9]+ - # SKIP' "$log" || true)
    notok=$(grep -cE '^not ok [0-9]+ ' "$log" || true)
    line="$((ok - skip)) successes / $notok failures / 0 errors / $skip pending"
  fi
  if [ -z "$line" ]; then
    failed=$((failed + 1))
    note "stage specs[$label]: CRASHED or no summary (exit $rc; counted as 1 failure)"
    return
  fi
  local s f e p
  read -r s f e p < <(echo "$line" |
    sed -E 's#^([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) pending.*#\1 \2 \3 \4#')
  passed=$((passed + s))
  failed=$((failed + f + e))
  skipped=$((skipped + p))
  local extra=""
  if [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
    failed=$((failed + 1))
    extra=" + exit status $rc with no failing spec (crash or leak report at exit; counted as 1 failure)"
  fi
  note "stage specs[$label]: passed=$s failed=$f errors=$e pending=$p$extra"
}

# ctest <label> <build dir> [env assignments...]
stage_ctest() {
  local label=$1 dir=$2; shift 2
  local log="$logdir/ctest-$label.log"
  banner "C tests: $label (ctest in $dir)"
  if [ ! -f "$dir/CTestTestfile.cmake" ]; then
    failed=$((failed + 1))
    note "stage ctest[$label]: FAILED: no ctest configuration in $dir (counted as 1 failure)"
    return
  fi
  (cd "$dir" && env "$@" ctest --output-on-failure --no-tests=ignore -j"$jobs") 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local total=0 nfail=0 nskip=0 line
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [ -n "$line" ]; then
    nfail=$(echo "$line" | sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/')
    total=$(echo "$line" | sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/')
    nskip=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$log" || true)
  elif grep -q 'No tests were found' "$log"; then
    total=0
  else
    failed=$((failed + 1))
    note "stage ctest[$label]: CRASHED or no summary (exit $rc; counted as 1 failure)"
    return
  fi
  local npass=$((total - nfail - nskip))
  passed=$((passed + npass))
  failed=$((failed + nfail))
  skipped=$((skipped + nskip))
  local extra=""
  if [ "$rc" -ne 0 ] && [ "$nfail" -eq 0 ]; then
    failed=$((failed + 1))
    extra=" + exit status $rc with no failing test (counted as 1 failure)"
  fi
  note "stage ctest[$label]: passed=$npass failed=$nfail skipped=$nskip$extra"
}

# ---- run ------------------------------------------------------------------------

start=$(date +%s)

if stage_setup release build; then
  stage_specs release build
  stage_ctest release build
fi

if [ "$quick" -eq 0 ]; then
  # allocator_may_return_null=1: an absurd allocation must reach needle's
  # ND_ERR_MEMORY path (the specs test it) instead of aborting inside ASan.
  # intercept_tls_get_addr=0: GCC 12's sanitizer runtime takes a dynamic TLS
  # block (POCL's, LLVM's) that malloc happens to place at a certain page
  # offset for a glibc-2.19 block with a header, reads garbage bounds from it
  # and LeakSanitizer's tracer crashes at exit ("Tracer caught signal 11",
  # fixed in GCC 14 / LLVM 17); where it lands depends on the heap layout, so
  # any change can make it appear. Dynamic TLS is then not scanned for
  # pointers: a leak report could only grow, never hide one of needle's.
  san_env=(
    "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1:intercept_tls_get_addr=0"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
  )
  # Leaks inside third-party libraries only (never needle's code); see the file.
  if [ -f cmake/lsan.supp ]; then
    san_env+=("LSAN_OPTIONS=suppressions=$root/cmake/lsan.supp:print_suppressions=0")
  fi
  if stage_setup sanitize build-asan --sanitize; then
    stage_specs sanitize build-asan "${san_env[@]}"
    stage_ctest sanitize build-asan "${san_env[@]}"
  fi
fi

banner "summary ($(( $(date +%s) - start ))s)"
for l in "${report[@]}"; do echo "$l"; done
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
