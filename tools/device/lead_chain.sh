#!/usr/bin/env bash
# The lead's device sequence (session 10): several stages in one device call, so that one warm
# machine serves build, tests, sanitizers, kernel benchmarks and run_serving.sh stages back to back.
# Usage (repo root on the GPU machine; the first call carries .devdeps):
#   tools/device/lead_chain.sh STAGE...
# Stages, run in the order given; everything lands in $OUT (chain.log and each stage's files):
#   deps   copy the carried .devdeps (tools/device/fetch_debs.sh) to /tmp/devdeps, where later
#          warm calls find it without carrying it again
#   build  tools/device/build.sh into /tmp/ratekv-build (TARGETS, default ratekv_cli test_cuda
#          test_engine bench_cuda_decode)
#   tests  test_cuda (filter TF_CUDA, default all) and test_engine (TF_ENGINE, default all but the
#          real-model tests) as gtest JSON; limits TL_CUDA / TL_ENGINE seconds
#   san    compute-sanitizer over SAN_TESTS, space-separated "tool:binary:gtest-filter" items
#          (e.g. "memcheck:test_cuda:CudaPackedDecode.Small"); TL_SAN seconds each
#   kern   bench_cuda_decode once per ';'-separated argument list in KB (kern1.json, kern2.json, ...)
#   serv   tools/device/run_serving.sh with STAGES=$SERV (DEADLINE=SERV_DEADLINE; REQUESTS, REQ_GEN,
#          TTFT128_LIMIT pass through) into $OUT/serv
#   sh     bash -c "$SH" (a one-off command, its tail in chain.log)
# The device README's 8-file limit per call applies to $OUT: keep a call's stages few.
set -uo pipefail
ROOT=$(pwd); O=${OUT:-/tmp/out}; mkdir -p "$O"; LOG=$O/chain.log
B=/tmp/ratekv-build
T0=$(date +%s)
say() { echo "== $* ($(date +%T), +$(($(date +%s) - T0)) s)" | tee -a "$LOG"; }
for st in "$@"; do
  case $st in
  deps)
    if [ -d .devdeps ]; then rm -rf /tmp/devdeps; cp -r .devdeps /tmp/devdeps; fi
    ls /tmp/devdeps | wc -l | tee -a "$LOG" ;;
  build)
    say build
    DEPS=/tmp/devdeps BUILD=$B TARGETS="${TARGETS:-ratekv_cli test_cuda test_engine bench_cuda_decode}" \
      tools/device/build.sh > "$O/build.log" 2>&1; echo "build exit $?" | tee -a "$LOG"
    grep -E "build.sh:|error" "$O/build.log" | head -30 | tee -a "$LOG" ;;
  tests)
    source $B/env.sh
    say test_cuda
    timeout ${TL_CUDA:-200} $B/tests/test_cuda --gtest_filter="${TF_CUDA:-*}" --gtest_output=json:$O/test_cuda.json > $O/test_cuda.log 2>&1
    echo "test_cuda exit $?" | tee -a "$LOG"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|Expected|Which is|actual" $O/test_cuda.log | head -60 | tee -a "$LOG"
    say test_engine
    timeout ${TL_ENGINE:-240} $B/tests/test_engine --gtest_filter="${TF_ENGINE:--EngineSmolLM2.*:EngineGemma3.Real*}" --gtest_output=json:$O/test_engine.json > $O/test_engine.log 2>&1
    echo "test_engine exit $?" | tee -a "$LOG"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|Expected|Which is|actual" $O/test_engine.log | head -60 | tee -a "$LOG" ;;
  san)
    source $B/env.sh
    for spec in ${SAN_TESTS:-}; do
      tool=${spec%%:*}; rest=${spec#*:}; bin=${rest%%:*}; filt=${rest#*:}
      say "compute-sanitizer $tool $bin $filt"
      timeout ${TL_SAN:-90} compute-sanitizer --tool $tool --error-exitcode 3 $B/tests/$bin --gtest_filter="$filt" >> $O/sanitize.log 2>&1
      echo "exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitize.log | tail -1)" | tee -a "$LOG"
    done ;;
  kern)
    source $B/env.sh
    i=0; IFS=';' read -ra RUNS <<< "${KB:-}"
    for args in "${RUNS[@]}"; do
      i=$((i+1)); say "bench_cuda_decode $args"
      timeout ${TL_KERN:-120} $B/bench/bench_cuda_decode --out $O/kern$i.json $args 2>&1 | grep -vE "^\s*$" | tail -${KERN_TAIL:-40} | tee -a "$LOG"
    done ;;
  serv)
    source $B/env.sh
    say "run_serving $SERV"
    OUT=$O/serv BUILD=$B DEADLINE=${SERV_DEADLINE:-470} STAGES="$SERV" tools/device/run_serving.sh > $O/serv.log 2>&1
    grep -E "^== |bench |exit|tokens/s|ms|TTFT|x$" $O/serv/all.log | tail -60 | tee -a "$LOG" ;;
  sh)
    say "sh: $SH"; bash -c "$SH" 2>&1 | tail -80 | tee -a "$LOG" ;;
  esac
done
say done
