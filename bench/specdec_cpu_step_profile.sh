#!/usr/bin/env bash
# The CPU profile that prices vLLM-on-CPU's decode and verify steps from the engine's own
# GEMM (docs/cost-model.md, "Speculative decoding on the CPU: the verify GEMM"):
#   - the weight stream W, the GEMM rate R and the roof's shape k = 1 from
#     bench/cpu_gemm_rows.py's run (vLLM's onednn_mm at 1-256 rows; k = 1 fits best),
#   - the engine's fixed cost per step (overhead_s) fitted on the decode steps of the
#     mixed-step run (data/cpu/vllm-mixed-TAG.csv, kind = decode), nothing else fitted.
# Usage: bench/specdec_cpu_step_profile.sh GEMM_ROWS.json PROBE.toml MIXED_PROFILE.toml MIXED.csv OUTDIR
set -euo pipefail
ROWS=$1 PROBE=$2 PRIOR=$3 CSV=$4 OUT=$5
HERE=$(cd "$(dirname "$0")" && pwd)
read -r R BW < <(HERE=$HERE python3 - "$ROWS" "$PROBE" <<'PY'
import json, sys, tomllib
sys.path.insert(0, __import__("os").environ["HERE"])
import cpu_gemm_rows as g
run = json.load(open(sys.argv[1]))
probe = tomllib.load(open(sys.argv[2], "rb"))
fit = next(x for x in g.fit(run) if x["roof_sharpness"] == 1.0)
print(fit["gemm_flops"], run["weight_bytes"] / fit["weight_s"] / probe["hbm_bandwidth_bytes_s"])
PY
)
mkdir -p "$OUT"
{ echo "# $PROBE with bf16_flops = R, the engine's GEMM rate that bench/cpu_gemm_rows.py fitted ($ROWS, roof k = 1)"
  sed "s/^bf16_flops = .*/bf16_flops = $R/" "$PROBE"; } > "$OUT/probe-onednn.toml"
sed -e "s/^roof_sharpness = .*/roof_sharpness = 1.0/" \
    -e "/^\[gpu_scale\]/,/^\[/ s/^compute = .*/compute = 1.0/" \
    -e "/^\[efficiency\]/,/^\[/ s/^bandwidth = .*/bandwidth = $BW/" \
    -e "s/^overhead_s = .*/overhead_s = 0.005/" "$PRIOR" > "$OUT/prior.toml"
{ head -1 "$CSV"; grep '^decode,' "$CSV"; } > "$OUT/decode.csv"
python3 -m bstar calibrate "$OUT/decode.csv" --model "$HERE/../data/cpu/tiny-config.json" \
  --gpu "$OUT/probe-onednn.toml" --dtype fp32 --kv-dtype fp32 --engine vllm \
  --profile "$OUT/prior.toml" --fit overhead_s -o "$OUT/step-profile.toml" --force
