#!/usr/bin/env bash
# Interleaved rounds of `cargo xtask llm-bench` (ours) and llama.cpp's llama-bench
# (reference/llama-bench.sh, plain attention path: -fa 0, as ours) on the same model, same
# -p/-n/-t/-r, in the same run: one JSON line per round and side on stderr, then the medians
# and the ratios ours/llama.cpp as one JSON line on stdout.
#
# Usage: crates/llm/compare-llama-bench.sh [ROUNDS] [-p 64] [-n 32] [-t 2] [-r 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=3
if [[ ${1:-} =~ ^[0-9]+$ ]]; then ROUNDS=$1; shift; fi
ARGS=("$@")
cargo build -q --release -p llm --example llm_bench >&2
ours=() theirs=()
for ((i = 1; i <= ROUNDS; i++)); do
    o=$(cargo xtask llm-bench "${ARGS[@]}" --json 2>/dev/null | tail -n 1)
    t=$(crates/llm/reference/llama-bench.sh "${ARGS[@]}" -fa 0 2>/dev/null | tail -n 1)
    echo "round $i ours $o" >&2
    echo "round $i llama.cpp $t" >&2
    ours+=("$o") theirs+=("$t")
done
python3 - "${#ours[@]}" "${ours[@]}" "${theirs[@]}" <<'PY'
import json, statistics, sys
n = int(sys.argv[1])
ours = [json.loads(x) for x in sys.argv[2:2 + n]]
theirs = [json.loads(x) for x in sys.argv[2 + n:]]
out = {}
for k in ours[0]:
    o = statistics.median(r[k] for r in ours)
    t = statistics.median(r[k] for r in theirs)
    out[k] = {"ours": o, "llama.cpp": t, "ratio": round(o / t, 3) if t else None}
print(json.dumps(out))
PY
