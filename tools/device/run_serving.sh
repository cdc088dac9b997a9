#!/usr/bin/env bash
# The GPU engine's issue 2 of 3 on the GPU machine, in one device call
# (≤ 8 device minutes): chunked prefill, continuous batching, GPU sampling.
#
# Usage (from the tree's root on the GPU machine; carry .devdeps):
#   DEPS=$PWD/.devdeps tools/device/run_serving.sh
#   STAGES="tests sanitize" tools/device/run_serving.sh      (a subset; build already there)
# Stages (default all, in this order; each has its own time limit, all of
# them DEADLINE seconds (470) together, and a failing stage does not stop the
# next):
#   build     tools/device/build.sh (ratekv_cli, test_engine)
#   tests     test_engine (all but EngineSmolLM2): chunked = one-piece prefill,
#             chunked vs the CPU runtime, continuous batch = alone, GPU
#             sampling = the host reference, the issue-17 tests
#   ttft      time to first token, Llama-3.1-8B synthetic, fp16 vs K3V3:
#             8K and 32K prompts chunked by 2048, and 8K in one piece
#   stream    a request stream on a 2 GiB pool: 128 requests of 256 prompt +
#             512 output tokens, fp16 vs K3V3, batch ≤ 128
#   memcheck  compute-sanitizer memcheck (the tiny model through every path,
#             chunked prefill included; the new kernels)
#   ttft128   the 128K prompt (chunked by 2048, no warm-up prefill), fp16 vs K3V3
#   racecheck compute-sanitizer racecheck (the tile softmax, the sampler, the
#             tiny model eager)
#   prefill_vs_sdpa  (not in the default list: STAGES="build prefill_vs_sdpa collect", ≤ 265 s)
#             issue 18, Llama-3.1-8B shapes, prompts PVS_PROMPTS (8192,32768), one piece and
#             chunks of 2048: ratekv bench fp16 / K3V3 prefill tokens/s, then
#             tools/device/prefill_vs_sdpa.py (torch SDPA flash attention alone per layer, HF
#             LlamaForCausalLM + SDPA end to end), then prefill_vs_sdpa_table.py:
#             $OUT/prefill_vs_sdpa.json and .md (ratekv is end to end only: no per-layer
#             prefill attention timer)
#   collect   $OUT/serving_h200.json: every row + the test summary
# Files in $OUT: all.log, test_engine.json, sanitize.log, ttft.json,
# ttft128.json, stream.json, prefill_vs_sdpa.{json,md}, serving_h200.json.
set -x
set -uo pipefail
STAGES=${STAGES:-build tests ttft stream memcheck ttft128 racecheck collect}
OUT=${OUT:-/tmp/ratekv_serving_out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-/tmp/ratekv-build}
LOG=$OUT/all.log
RK=$B/bin/ratekv
T0=$(date +%s)
DEADLINE=${DEADLINE:-470}  # seconds for all stages (≤ 8 device minutes with the machine's start)
# lim N: N, or the seconds left before DEADLINE when fewer (0: skip the stage).
lim() { local left=$((DEADLINE - ($(date +%s) - T0))); [ $left -lt $1 ] && echo $((left > 1 ? left : 1)) || echo $1; }
say() { echo "== $* ($(date +%T), +$(($(date +%s) - T0)) s)" | tee -a "$LOG"; }
has() { [[ " $STAGES " == *" $1 "* ]] && { [ "$1" = collect ] || [ "$(lim 10)" -gt 5 ] || { say "skip $1: deadline"; false; }; }; }
[ -f "$B/env.sh" ] && source "$B/env.sh"
export PYTHONUNBUFFERED=1
set +x

if has build; then
  say "build"
  TARGETS="ratekv_cli test_engine" timeout $(lim 240) "$ROOT/tools/device/build.sh" > /tmp/serving_build.log 2>&1
  echo "build exit $?" | tee -a "$LOG"
  tail -15 /tmp/serving_build.log | tee -a "$LOG"
  source "$B/env.sh"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
fi
if has tests; then
  say "test_engine"
  timeout $(lim 200) "$B/tests/test_engine" --gtest_filter='-EngineSmolLM2.*' --gtest_output=json:"$OUT/test_engine.json" \
    > /tmp/test_engine.log 2>&1
  echo "test_engine exit $?" | tee -a "$LOG"
  grep -E "^  |^\[  (PASSED|FAILED)|^\[  FAILED|^\[       OK|Failure|Expected|Which is|actual|error" /tmp/test_engine.log \
    | head -200 | tee -a "$LOG"
fi
# bench JSON rows → a file, also when the command is stopped at its limit.
bench() {
  local out=$1 lim=$2
  shift 2
  timeout "$(lim $lim)" "$@" -o json --out "$out" --force 2>&1 | grep --line-buffered -E "bench|error" | tee -a "$LOG"
  echo "bench exit ${PIPESTATUS[0]} -> $out" | tee -a "$LOG"
}
L="$RK bench --device cuda --synthetic llama-3.1-8b -ctk f16,tq3 -ctv f16,tq3 -r 1"
if has ttft; then
  say "ttft: 8K / 32K chunked by 2048, 8K one piece"
  bench /tmp/ttft_c.json 150 $L -p 8192,32768 -n 0 --chunk 2048
  bench /tmp/ttft_1.json 60 $L -p 8192 -n 0
  python3 - "$OUT/ttft.json" /tmp/ttft_c.json /tmp/ttft_1.json <<'PY'
import json, os, sys
src = [f for f in sys.argv[2:] if os.path.exists(f)]
if src:
    m = json.load(open(src[0])); m["rows"] = [r for f in src for r in json.load(open(f))["rows"]]
    json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
fi
if has stream; then
  say "stream: 128 requests x (256 prompt + 512 output), 2 GiB pool, fp16 vs K3V3"
  bench "$OUT/stream.json" 150 $L -p 0 -n 0 --requests ${REQUESTS:-128} --req-prompt 256 --req-gen ${REQ_GEN:-512} \
    --pool-gib 2 --stream-batch 128 --chunk 256
fi
if has memcheck; then
  for t in EngineSanitize.TinyModelGraphs EngineKernels.TiledOnlineSoftmaxEqualsWholeRowSoftmax \
           EngineKernels.Fp16ReaderReadsWhatTheWriterWrote EngineKernels.SampleRowsMatchesTheReference \
           Engine.ChunkedPrefillRefusals; do
    say "compute-sanitizer memcheck $t"
    [ "$(lim 60)" -gt 5 ] || break
    timeout $(lim 60) compute-sanitizer --tool memcheck --kernel-name kns=ratekv --error-exitcode 3 "$B/tests/test_engine" \
      --gtest_filter="$t" >> "$OUT/sanitize.log" 2>&1
    echo "exit $? $(tail -3 "$OUT/sanitize.log" | grep -E 'SUMMARY' | head -1)" | tee -a "$LOG"
  done
fi
if has ttft128; then
  say "ttft: 128K chunked by 2048 (fp16, then K3V3: each its own file, so one finished row survives a limit)"
  L0="$RK bench --device cuda --synthetic llama-3.1-8b -r 1 -p 131072 -n 0 --chunk 2048 --pp-warmup 0"
  bench /tmp/t128_f16.json ${TTFT128_LIMIT:-90} $L0 -ctk f16 -ctv f16
  bench /tmp/t128_k3.json ${TTFT128_LIMIT:-90} $L0 -ctk tq3 -ctv tq3
  python3 - "$OUT/ttft128.json" /tmp/t128_f16.json /tmp/t128_k3.json <<'PY'
import json, os, sys
src = [f for f in sys.argv[2:] if os.path.exists(f)]
if src:
    m = json.load(open(src[0])); m["rows"] = [r for f in src for r in json.load(open(f))["rows"]]
    json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
fi
if has racecheck; then
  # racecheck unfiltered (with --kernel-name, the uninstrumented cuBLAS GEMMs fault under racecheck; run_engine.sh).
  for t in EngineKernels.TiledOnlineSoftmaxEqualsWholeRowSoftmax EngineKernels.SampleRowsMatchesTheReference \
           EngineSanitize.TinyModelEager; do
    say "compute-sanitizer racecheck $t"
    [ "$(lim 60)" -gt 5 ] || break
    timeout $(lim 60) compute-sanitizer --tool racecheck --error-exitcode 3 "$B/tests/test_engine" \
      --gtest_filter="$t" >> "$OUT/sanitize.log" 2>&1
    echo "exit $? $(tail -3 "$OUT/sanitize.log" | grep -E 'SUMMARY' | head -1)" | tee -a "$LOG"
  done
  grep -E -B2 -A12 "Race reported|Invalid|Error:" "$OUT/sanitize.log" | head -60 | tee -a "$LOG"
fi
if has prefill_vs_sdpa; then
  # Both sides in this call, the same GPU: ratekv one piece per prompt (its own file, so a limit on
  # 32K keeps the 8K rows), ratekv chunked, then torch (rows written as they finish), then the table.
  P=${PVS_PROMPTS:-8192,32768}
  say "prefill_vs_sdpa: ratekv vs SDPA flash / HF+SDPA prefill, prompts $P, one piece and chunks of 2048"
  LP="$RK bench --device cuda --synthetic llama-3.1-8b -ctk f16,tq3 -ctv f16,tq3 -r 1 -n 0"
  rm -f /tmp/pvs_*.json
  PVS_RK=""
  for p in ${P//,/ }; do
    bench "/tmp/pvs_rk_$p.json" $((p <= 8192 ? 30 : 60)) $LP -p "$p"
    PVS_RK="$PVS_RK /tmp/pvs_rk_$p.json"
  done
  bench /tmp/pvs_rk_chunked.json 60 $LP -p "$P" --chunk 2048
  timeout "$(lim 110)" python3 "$ROOT/tools/device/prefill_vs_sdpa.py" --prompts "$P" --chunk 2048 \
    --out /tmp/pvs_torch.json 2>&1 | tee -a "$LOG"
  echo "prefill_vs_sdpa.py exit ${PIPESTATUS[0]}" | tee -a "$LOG"
  python3 "$ROOT/tools/device/prefill_vs_sdpa_table.py" --ratekv $PVS_RK /tmp/pvs_rk_chunked.json \
    --torch /tmp/pvs_torch.json --out "$OUT/prefill_vs_sdpa.json" --md "$OUT/prefill_vs_sdpa.md" 2>&1 | tee -a "$LOG"
fi
if has collect; then
  say "collect"
  python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, os, sys
out = sys.argv[1]
doc = {"rows": [], "meta": {}}
for name in ("ttft.json", "ttft128.json", "stream.json"):
    f = os.path.join(out, name)
    if os.path.exists(f):
        d = json.load(open(f))
        doc["rows"] += d.get("rows", [])
        doc["meta"][name] = {k: v for k, v in d.items() if k != "rows"}
t = os.path.join(out, "test_engine.json")
if os.path.exists(t):
    d = json.load(open(t))
    doc["test_engine"] = {"tests": d.get("tests"), "failures": d.get("failures"),
                          "failed": [f"{s['name']}.{c['name']}" for s in d.get("testsuites", [])
                                     for c in s.get("testsuite", []) if c.get("failures")]}
# fp16 vs K3V3 side by side
by = {}
for r in doc["rows"]:
    by.setdefault((r.get("test"), r.get("chunk", 0)), {})[r.get("cache")] = r
cmp = []
for (test, chunk), c in sorted(by.items(), key=lambda kv: str(kv[0])):
    f, k = c.get("fp16"), c.get("K3V3")
    if not f or not k:
        continue
    e = {"test": test, "chunk": chunk}
    for key in ("ttft_ms", "prefill_tok_s", "output_tok_s", "requests_per_s", "max_concurrent"):
        if key in f and key in k and f[key]:
            e[key] = {"fp16": f[key], "K3V3": k[key], "K3V3_over_fp16": k[key] / f[key]}
    cmp.append(e)
doc["fp16_vs_K3V3"] = cmp
p = os.path.join(out, "prefill_vs_sdpa.json")
if os.path.exists(p):  # its own rows stay in prefill_vs_sdpa.json (same tests as ttft.json's, another run)
    d = json.load(open(p))
    doc["prefill_vs_sdpa"] = {"facts": d.get("facts"), "table": d.get("table"), "missing": d.get("missing")}
json.dump(doc, open(os.path.join(out, "serving_h200.json"), "w"), indent=1)
print(json.dumps(cmp, indent=1))
PY
fi
say "done"
