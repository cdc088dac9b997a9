#!/usr/bin/env bash
# The GPU engine on the GPU machine (issue 17), one stage list per device call.
# Everything lands in $OUT (at most 8 files come back: keep to the names below).
#
# Usage (from the tree's root on the GPU machine):
#   STAGES="build tests sanitize bench_llama bench_qwen sdpa pybuild" DEPS=<.devdeps> tools/device/run_engine.sh
#   STAGES="hf" tools/device/run_engine.sh
#   STAGES="smollm2 hf" tools/device/run_engine.sh   (after /tmp/smolparts holds smollm2.part* + eval.txt)
#   STAGES="build niah_smollm2" DEPS=<.devdeps> SMOL_PARTS=<dir> tools/device/run_engine.sh
# Stages:
#   build     tools/device/build.sh (ratekv_cli, test_cuda, test_engine)
#   tests     test_cuda (fp16 kernels, append/prefill, small packed) + test_engine
#   sanitize  compute-sanitizer memcheck + racecheck on the engine's kernels
#             (EngineSanitize: a tiny model through every path; EngineKernels)
#   bench_llama / bench_qwen   ratekv bench on the synthetic models (JSON)
#   sdpa      tools/device/e2e_peers.py sdpa at the fp16 rows' shapes
#   smollm2   SmolLM2 from SMOL_PARTS: the EngineSmolLM2 tests, its tokens/s,
#             generate and perplexity with --device cuda
#   pybuild   the Python extension (ratekv_python) in the same build directory
#   hf        tools/device/e2e_peers.py hf (transformers eager / static+compile)
#   niah_smollm2  NIAH on SmolLM2 on the GPU (issue 18): the GPU-vs-CPU NIAH
#             tests, then `ratekv niah --device cuda` at 8K (8182 prompt + 10
#             answer tokens = the trained 8192; first, so a time cut falls on
#             the next row) and 512 (paired with the CPU grid of
#             bench/results/niah_smollm2.json), 11 depths × NIAH_TRIALS
#             (20) trials, one process per cache: fp16, uniform K3V3, uniform
#             K2V2, Block-GTQ at K3V3's stored bits (the committed plans of
#             bench/results/niah_plans; NIAH_PLANS overrides; block-gtq-k3v3-
#             equal.plan.json stores 3.2375 bits per element against uniform
#             K3V3's 3.25, made by `ratekv plan --method block-gtq --stats
#             bench/results/niah_plans/ratequant-2.25.stats.json --kbits 3.25
#             --vbits 3.25` — the older block-gtq-k3v3.plan.json stores 3.50,
#             not a fair pair; both have 0-bit key groups), evaluation mode
#             (NIAH_MODES="evaluation serving" adds serving), each grid cut at
#             NIAH_GRID_TIMEOUT (30 s; a cut grid keeps its complete rounds
#             of trials, marked partial). Haystack: SMOL_PARTS/haystack/*.txt
#             (the essays, tools/fetch_assets.sh), else the eval text (named
#             in the report).
# Files: all.log, test_engine.json, sanitize.log, bench_llama.json,
# bench_qwen.json, sdpa.json, smollm2.json, hf.json; niah_smollm2_h200.json
# and niah_smollm2_h200.md (niah_smollm2 stage).
set -uo pipefail
OUT=${OUT:-/tmp/ratekv_engine_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-/tmp/ratekv-build}
LOG=$OUT/all.log
RK=$B/bin/ratekv
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
# merge DEST SRC...: the rows of every existing SRC (ratekv bench -o json) into
# DEST, rewritten after each bench command so that a call stopped at its time
# limit still returns what was measured.
merge() { python3 - "$@" <<'PY'
import json, os, sys
srcs = [f for f in sys.argv[2:] if os.path.exists(f)]
if srcs:
    m = json.load(open(srcs[0])); m["rows"] = [r for f in srcs for r in json.load(open(f))["rows"]]
    json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
}
[ -f "$B/env.sh" ] && source "$B/env.sh"
export PYTHONUNBUFFERED=1

if has build; then
  say "build"
  TARGETS="ratekv_cli test_cuda test_engine" "$ROOT/tools/device/build.sh" 2>&1 | tail -8 | tee -a "$LOG" || exit 1
  source "$B/env.sh"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee -a "$LOG"
fi
if has tests; then
  say "test_cuda (fp16 kernels both variants, append, prefill, small packed)"
  "$B/tests/test_cuda" --gtest_filter='CudaFp16Decode.*:CudaPackedAppend.*:CudaPackedPrefill.*:CudaPackedDecode.Small' 2>&1 \
    | grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|error|rel err" | tail -20 | tee -a "$LOG"
  say "test_engine"
  "$B/tests/test_engine" --gtest_filter='-EngineSmolLM2.*' --gtest_output=json:"$OUT/test_engine.json" > /tmp/test_engine.log 2>&1
  grep -E "^  |^\[  (PASSED|FAILED)|^\[  FAILED|Failure|Expected|Which is|actual|error" /tmp/test_engine.log | head -120 | tee -a "$LOG"
fi
if has sanitize; then
  # One test per sanitizer process (a reported hazard can leave the context
  # unusable for the tests after it); the full reports go to sanitize.log.
  # SANITIZE_TESTS: EngineSanitize.TinyModelEager / TinyModelGraphs drive a
  # tiny model through every engine kernel (prefill both modes, fp16 and
  # packed decode), with eager launches and with graph replays, in separate
  # processes; the EngineKernels.* tests add the single-kernel checks.
  # RACECHECK_TESTS (default: SANITIZE_TESTS' list) replaces the list for
  # racecheck, which is 10-50x slower than memcheck: e.g.
  # EngineSanitize.TinyGemma3RacecheckEager / ...Graphs (a one-layer Gemma 3,
  # each under 60 s) where memcheck runs EngineSanitize.TinyGemma3EveryPath.
  # SANITIZE_TIMEOUT (s, default 600) cuts one sanitizer process (exit 124).
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    tests=${SANITIZE_TESTS:-EngineSanitize.TinyModelEager EngineSanitize.TinyModelGraphs}
    [ $tool = racecheck ] && tests=${RACECHECK_TESTS:-$tests}
    for t in $tests; do
      # racecheck runs unfiltered: with --kernel-name, the kernels it does not
      # instrument (cuBLAS's GEMMs) fault under racecheck (compute-sanitizer
      # 2025.x; reproduced with one torch matmul and a filter matching nothing),
      # which read as an engine hazard before (docs/e2e_results.md).
      filt=(--kernel-name kns=ratekv); [ $tool = racecheck ] && filt=()
      say "compute-sanitizer $tool $t ${filt[*]}"
      timeout ${SANITIZE_TIMEOUT:-600} compute-sanitizer --tool $tool "${filt[@]}" --error-exitcode 3 "$B/tests/test_engine" \
        --gtest_filter="$t" >> "$OUT/sanitize.log" 2>&1
      echo "exit $? $(tail -3 "$OUT/sanitize.log" | grep -E 'SUMMARY' | head -1)" | tee -a "$LOG"
    done
  done
  grep -E -B2 -A12 "Race reported|Invalid|Error:" "$OUT/sanitize.log" | head -60 | tee -a "$LOG"
fi
if has pybuild; then
  # The Python extension in the same build directory (configured after
  # the engine's targets are built, so a missing Python development setup
  # cannot cost them; before the benchmarks, which take the rest of a call).
  say "build: Python extension"
  CMAKE_ARGS="-DRATEKV_PYTHON=ON -DPython_EXECUTABLE=$(command -v python3)" TARGETS="ratekv_python" \
    "$ROOT/tools/device/build.sh" 2>&1 | tail -6 | tee -a "$LOG"
fi
# The benchmark grid (issue 17, docs/e2e_results.md). Llama-3.1-8B synthetic:
# every cache at depth 128K at B = 1 and 7 (the largest B its fp16 cache fits:
# 17.2 GB per sequence in a ~131 GB pool), Block-GTQ at the same points, K3V3
# at B = 32 (fp16 refused), a 1M-token context at B = 4 (fp16 refused), and
# rows from a real 4K prefill. Qwen2.5-7B (GQA 7) at depth 32K, B = 1 and 32.
bench() { local out=$1; shift; "$@" --out "$out" --force 2>&1 | grep --line-buffered -E "bench:|error" | tee -a "$LOG"; }
if has bench_llama; then
  say "bench: Llama-3.1-8B synthetic"
  python3 "$ROOT/tools/device/gtq_shape_plan.py" --model llama-3.1-8b --src "$ROOT/bench/results/niah_plans/block-gtq-k3v3.plan.json" \
    --out /tmp/gtq_llama.plan.json | tee -a "$LOG"
  L="$RK bench --device cuda --synthetic llama-3.1-8b -c 1100000 -p 0 -r 3 -o json --profile ${BENCH_EXTRA:-}"
  LL=(/tmp/b1.json /tmp/b2.json /tmp/b4.json /tmp/b5.json /tmp/b6.json)
  bench /tmp/b1.json $L -ctk f16,tq3,tq2,tq4 -ctv f16,tq3,tq2,tq4 -d 131072 -b ${LLAMA_B:-1,7} -n ${NGEN:-32}
  merge "$OUT/bench_llama.json" "${LL[@]}"
  bench /tmp/b2.json $L --plan /tmp/gtq_llama.plan.json -d 131072 -b ${LLAMA_B:-1,7} -n ${NGEN:-32}
  merge "$OUT/bench_llama.json" "${LL[@]}"
  bench /tmp/b4.json $L -ctk tq3,f16 -ctv tq3,f16 -d 131072 -b 32 -n 32
  merge "$OUT/bench_llama.json" "${LL[@]}"
  bench /tmp/b5.json $L -ctk tq3,f16 -ctv tq3,f16 -d 1048576 -b 4 -n 32
  merge "$OUT/bench_llama.json" "${LL[@]}"
  bench /tmp/b6.json $RK bench --device cuda --synthetic llama-3.1-8b -c 1100000 -ctk f16,tq3 -ctv f16,tq3 -p 4096 \
    -n ${NGEN:-32} -d 4096 -b 1 -r 3 -o json
  merge "$OUT/bench_llama.json" "${LL[@]}"
fi
if has sdpa; then
  say "torch SDPA flash at the fp16 rows' shapes"
  python3 "$ROOT/tools/device/e2e_peers.py" sdpa --hq 32 --hkv 8 --shapes ${SDPA_LLAMA:-1:131072,7:131072,1:4096} \
    --out /tmp/s1.json 2>&1 | tee -a "$LOG"
  python3 "$ROOT/tools/device/e2e_peers.py" sdpa --hq 28 --hkv 4 --shapes ${SDPA_QWEN:-1:32768,32:32768} \
    --out /tmp/s2.json 2>&1 | tee -a "$LOG"
  python3 -c "import json,sys; a=json.load(open(sys.argv[2])); a['rows']+=json.load(open(sys.argv[3]))['rows']; json.dump(a,open(sys.argv[1],'w'),indent=1)" \
    "$OUT/sdpa.json" /tmp/s1.json /tmp/s2.json
fi
if has bench_qwen; then
  say "bench: Qwen2.5-7B synthetic (GQA 7)"
  python3 "$ROOT/tools/device/gtq_shape_plan.py" --model qwen2.5-7b --src "$ROOT/bench/results/niah_plans/block-gtq-k3v3.plan.json" \
    --out /tmp/gtq_qwen.plan.json | tee -a "$LOG"
  Q="$RK bench --device cuda --synthetic qwen2.5-7b -c 140000 -p 0 -r 2 -o json --profile ${BENCH_EXTRA:-}"
  bench /tmp/q1.json $Q -ctk f16,tq3,tq2,tq4 -ctv f16,tq3,tq2,tq4 -d 32768 -b ${QWEN_B:-1,32} -n ${NGEN:-32}
  merge "$OUT/bench_qwen.json" /tmp/q1.json /tmp/q2.json
  bench /tmp/q2.json $Q --plan /tmp/gtq_qwen.plan.json -d 32768 -b ${QWEN_B:-1,32} -n ${NGEN:-32}
  merge "$OUT/bench_qwen.json" /tmp/q1.json /tmp/q2.json
fi
# The GGUF arrives in parts over consecutive calls (each copied to
# SMOL_PARTS, default /tmp/smolparts, which persists while the machine stays
# warm), with eval.txt (and, for NIAH, haystack/*.txt).
SMOL_PARTS=${SMOL_PARTS:-/tmp/smolparts}
A=/tmp/assets
M=$A/models/SmolLM2-135M-Instruct.Q4_1.gguf
smol_assets() {
  mkdir -p $A/models $A/text
  if ! ls "$SMOL_PARTS"/smollm2.part* > /dev/null 2>&1; then
    echo "no $SMOL_PARTS/smollm2.part*: the SmolLM2 GGUF is not on this machine" | tee -a "$LOG"
    return 1
  fi
  cat "$SMOL_PARTS"/smollm2.part* > $M
  cp "$SMOL_PARTS"/eval.txt $A/text/eval.txt
  (cd $A/models && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf; ls -la "$SMOL_PARTS") | tee -a "$LOG"
  export RATEKV_ASSETS=$A
}
if has smollm2 && smol_assets; then
  say "SmolLM2 (real weights)"
  "$B/tests/test_engine" --gtest_filter='EngineSmolLM2.*' 2>&1 | grep -E "^  |PASSED|FAILED|Failure|Expected|Which|actual" | tee -a "$LOG"
  $RK bench -m $M -ctk f16,tq3,tq4 -ctv f16,tq3,tq4 -p 512 -n 128 -d 0,4096 -b 1,8 -r 3 -o json --device cuda \
    --out "$OUT/smollm2.json" --force 2>&1 | grep --line-buffered -E "bench:|error" | tee -a "$LOG"
  $RK generate -m $M -p "The capital of France is" -n 32 --device cuda -ctk tq3 -ctv tq3 2>&1 | tail -5 | tee -a "$LOG"
  $RK perplexity -m $M -f $A/text/eval.txt -c 512 --chunks 4 --device cuda -ctk tq3 -ctv tq3 2>&1 | tail -3 | tee -a "$LOG"
  $RK perplexity -m $M -f $A/text/eval.txt -c 512 --chunks 4 -ctk tq3 -ctv tq3 2>&1 | tail -3 | tee -a "$LOG"
fi
if has niah_smollm2 && smol_assets; then
  say "NIAH on SmolLM2 on the GPU: tests"
  "$B/tests/test_engine" --gtest_filter='Engine.NiahAnswersMatchCpu:EngineSmolLM2.NiahAnswersAndVerdictsMatchCpu' \
    2>&1 | grep -E "^  |PASSED|FAILED|Failure|Expected|Which|actual" | tee -a "$LOG"
  if ls "$SMOL_PARTS"/haystack/*.txt > /dev/null 2>&1; then
    HAY=$SMOL_PARTS/haystack
  else
    HAY=$A/text/hay_eval && mkdir -p $HAY && cp $A/text/eval.txt $HAY/eval.txt
    echo "haystack: $SMOL_PARTS/haystack/*.txt not found, the eval text stands in ($HAY)" | tee -a "$LOG"
  fi
  P=$ROOT/bench/results/niah_plans
  PLANS=${NIAH_PLANS:-"$P/uniform-k3v3.plan.json $P/uniform-k2v2.plan.json $P/block-gtq-k3v3-equal.plan.json"}
  G=/tmp/niah_grids && rm -rf $G && mkdir -p $G
  for mode in ${NIAH_MODES:-evaluation}; do
    i=0
    for plan in fp16 $PLANS; do
      i=$((i + 1))
      if [ $plan = fp16 ]; then sel=(); else sel=(--no-fp16 --plan $plan); fi
      say "niah --device cuda $mode ${plan##*/}"
      timeout -s INT ${NIAH_GRID_TIMEOUT:-30} $RK niah -m $M --device cuda --prefill-mode $mode --haystack $HAY \
        --ctx ${NIAH_CTX:-8182,512} --depths 11 --trials ${NIAH_TRIALS:-20} "${sel[@]}" \
        --json $G/$mode.$i.json --force 2>&1 | grep -E "GPU engine|cache bytes|^ +[0-9]+ |error" | tee -a "$LOG"
    done
  done
  # One report: every grid (partial ones marked), then the table.
  python3 - "$OUT/niah_smollm2_h200.json" $G/*.json <<'PY'
import json, sys
rep = None
for f in sys.argv[2:]:
    try:
        r = json.load(open(f))
    except (OSError, ValueError) as e:
        print(f"skipped {f}: {e}")
        continue
    for g in r["grids"]:
        g["prefill_mode"] = r["prefill_mode"]
        g["name"] = f"{g['name']} [{r['prefill_mode']}]"
    if rep is None:
        rep = r
    else:
        rep["grids"] += r["grids"]
if rep:
    rep["command"] = "STAGES=niah_smollm2 tools/device/run_engine.sh (one ratekv niah --device cuda per grid)"
    json.dump(rep, open(sys.argv[1], "w"), indent=1)
PY
  [ -f "$OUT/niah_smollm2_h200.json" ] && python3 "$ROOT/tools/niah_table.py" "$OUT/niah_smollm2_h200.json" "$OUT/niah_smollm2_h200.md" && \
    cat "$OUT/niah_smollm2_h200.md" | tee -a "$LOG"
fi
if has hf; then
  say "HF transformers peers (Llama-3.1-8B shapes, random bf16 weights, depth 128K)"
  timeout ${HF_TIMEOUT:-300} python3 "$ROOT/tools/device/e2e_peers.py" hf --model llama-3.1-8b --batch ${HF_B:-1,4} --depth 131072 \
    --setups ${HF_SETUPS:-eager-dynamic,static-compiled} --out "$OUT/hf.json" 2>&1 | grep -vE "Warning|warn" | tail -12 | tee -a "$LOG"
fi
say "done"
