#!/usr/bin/env bash
# Measure vLLM-on-CPU for data/cpu/: mixed steps (bench/mixed_steps.py), a closed-loop decode
# sweep and a Poisson rate sweep, all against one server; then calibrate on the decode levels.
#
#   BSTAR_VLLM_PYTHON=~/.cache/bstar/vllm-cpu-venv/bin/python bench/vllm_cpu_mixed.sh OUTDIR [RATES]
#
# Run it on a quiet machine: `pgrep -af vllm.entrypoints` empty, nothing else busy.
# Server: the default tiny model (bstar.tinymodel, ~95M), float32, eager, --max-num-seqs 16,
# --max-num-batched-tokens 256 (chunked prefill, vLLM V1's default scheduler), 1 GiB of KV,
# VLLM_THREADS (default "0": one OpenMP thread on core 0; on a machine shared with other
# jobs, two threads that spin-wait on each other stall for whole time slices).
set -euo pipefail
OUT=${1:?usage: vllm_cpu_mixed.sh OUTDIR [RATES]}
RATES=${2:-0.2,0.4,0.6}
THREADS=${VLLM_THREADS:-0}
NTHREADS=$(python3 -c "from bstar.servers import _count_cpus; print(_count_cpus('$THREADS'))")
PY=${BSTAR_VLLM_PYTHON:?set BSTAR_VLLM_PYTHON to vLLM-on-CPU\'s python}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$ROOT/src
mkdir -p "$OUT"
BUDGET=256
SEQS=16
PORT=$(python3 -c "from bstar.servers import free_port; print(free_port())")
HF=$(python3 -c "from bstar.tinymodel import default_tiny_dir; print(default_tiny_dir().hf_dir)")
URL=http://127.0.0.1:$PORT
GPU=$OUT/probe.toml
DEPLOY=(--model "$HF/config.json" --gpu "$GPU" --dtype fp32 --kv-dtype fp32)

date -u +"start %Y-%m-%dT%H:%M:%SZ, load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load.txt"
python3 -m bstar.cli probe -o "$GPU" --device cpu --threads "$NTHREADS" | tee "$OUT/probe.txt"

CMD=$(python3 - "$PY" "$HF" "$PORT" "$SEQS" "$BUDGET" "$THREADS" <<'EOF'
import shlex, sys
from bstar.servers import vllm_cpu_command, vllm_cpu_env
py, hf, port, seqs, budget, threads = sys.argv[1:]
cmd = vllm_cpu_command(py, hf, port=int(port), max_num_seqs=int(seqs), max_model_len=2048)
cmd += ["--max-num-batched-tokens", budget]
print(shlex.join(["env", *[f"{k}={v}" for k, v in vllm_cpu_env(threads).items()], *cmd]))
EOF
)
echo "$CMD" > "$OUT/server-cmd.txt"
setsid bash -c "exec $CMD" > "$OUT/vllm.log" 2>&1 &
SRV=$!
trap 'kill -- -$SRV 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -sf "$URL/health" >/dev/null 2>&1 && break
  kill -0 $SRV 2>/dev/null || { tail -20 "$OUT/vllm.log"; exit 1; }
  sleep 1
done
"$PY" -c "import vllm; print('vllm', vllm.__version__)" 2>/dev/null | tail -1 > "$OUT/vllm-version.txt" || true

python3 "$ROOT/bench/mixed_steps.py" --url "$URL" --batches 1,2,4,8 \
  --chunk-tokens 32,128,240 --repeats 4 -o "$OUT/mixed.csv" 2> "$OUT/mixed.log"
cat "$OUT/mixed.log"
DB=$OUT/runs.db
python3 -m bstar.cli sweep --url "$URL" --served-model tiny --concurrency 1,2,4,8 \
  --input-len 16 --output-len 96 --num-requests 8 --db "$DB" --quiet --json \
  "${DEPLOY[@]}" > "$OUT/decode-sweep.json"
python3 -m bstar.cli sweep --url "$URL" --served-model tiny --rate "$RATES" \
  --input-len 192 --output-len 64 --num-requests 16 --seed 1 --db "$DB" --quiet --json \
  "${DEPLOY[@]}" > "$OUT/rate-sweep.json"
date -u +"end %Y-%m-%dT%H:%M:%SZ, load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"
kill -- -$SRV 2>/dev/null || true
trap - EXIT
RUN=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$OUT/decode-sweep.json")
python3 -m bstar.cli calibrate "$RUN" --db "$DB" "${DEPLOY[@]}" --engine vllm \
  --vllm-log "$OUT/vllm.log" -o "$OUT/decode-profile.toml" | tee "$OUT/calibrate-decode.txt"
python3 -m bstar.cli calibrate "$OUT/mixed.csv" "${DEPLOY[@]}" --engine vllm \
  --vllm-log "$OUT/vllm.log" -o "$OUT/mixed-profile.toml" | tee "$OUT/calibrate-mixed.txt"
