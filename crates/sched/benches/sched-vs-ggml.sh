#!/usr/bin/env bash
# Wall time of our scheduler against ggml's on the llama32/cpu graph, in interleaved rounds:
# each round runs ggml with our fixture device's op checks, ggml with its CPU device, then
# ours (`SCHED_PERCALL`), 2,000 calls per op each, and the summary gives each side's fastest
# per-round p10 and the ratios. Interleaving matters on a shared machine whose speed changes
# from one second to the next: only figures from the same stretch of time compare.
#
# Usage: crates/sched/benches/sched-vs-ggml.sh [ROUNDS]   (default 20; run from the repo root)
# Needs: .ci/rpc-server-build.sh and crates/sched/benches/ggml-sched-bench.sh run once (they
# build ggml and the driver), and `cargo bench -p sched --bench sched --no-run`.
set -euo pipefail
ROUNDS=${1:-20}
RPC_DIR=${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}
DRIVER=$RPC_DIR/bin/ggml-sched-bench
GRAPH=$RPC_DIR/sched-tool/llama32.graph.json
[[ -x $DRIVER && -f $GRAPH ]] || {
    echo "run crates/sched/benches/ggml-sched-bench.sh first" >&2
    exit 1
}
TARGET=${CARGO_TARGET_DIR:-target}
OURS=$(find "$TARGET/release/deps" -maxdepth 1 -type f -executable -name 'sched-*' -printf '%T@ %p\n' |
    sort -rn | head -1 | cut -d' ' -f2)
[[ -n $OURS ]] || {
    echo "run cargo bench -p sched --bench sched --no-run first" >&2
    exit 1
}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
for r in $(seq 1 "$ROUNDS"); do
    "$DRIVER" "$GRAPH" --fixture-device --iters 2000 --rounds 1 2>&1 | sed 's/^/fx /'
    "$DRIVER" "$GRAPH" --iters 2000 --rounds 1 2>&1 | sed 's/^/gg /'
    SCHED_PERCALL=2000 "$OURS" --bench 2>&1
done >"$LOG"
python3 - "$LOG" <<'PY'
import re, sys
best = {}
pat = re.compile(r'^(fx ggml|gg ggml|ours)\s+(reset\+alloc_graph|split|reserve)\b.*p10\s+(\d+) ns')
for line in open(sys.argv[1]):
    m = pat.match(line)
    if m:
        k = (m.group(1), m.group(2))
        best[k] = min(best.get(k, 1e18), int(m.group(3)))
names = {'ours': 'ours', 'fx ggml': 'ggml, fixture op checks', 'gg ggml': 'ggml'}
for op in ['reset+alloc_graph', 'split', 'reserve']:
    o = best.get(('ours', op))
    row = ', '.join(f"{names[s]} {best[(s, op)] / 1000:.1f} µs" for s in names if (s, op) in best)
    ratios = ', '.join(f"÷ {names[s]} {o / best[(s, op)]:.2f}" for s in ['fx ggml', 'gg ggml'] if o and (s, op) in best)
    print(f"{op:<18} fastest p10: {row}; ours {ratios}")
PY
