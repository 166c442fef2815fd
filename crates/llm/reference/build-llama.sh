#!/usr/bin/env bash
# Build llama.cpp (the tree vendored in the PyPI sdist llama-cpp-python==0.3.36, pinned and
# hash-checked by .ci/ggml-sdist.sh) in a scratch directory outside the repository: the
# reference for the llm crate's golden files (make-goldens.sh) and its speed comparison
# (llama-bench.sh). Nothing of llama.cpp is committed.
#
# Usage:  crates/llm/reference/build-llama.sh [SCRATCH_DIR]
#         (default: ${LLAMA_REF_DIR:-$HOME/.cache/llama-ref}, with "-avx2" appended for
#         LLAMA_REF_ISA=avx2; jobs: ${LLAMA_REF_JOBS:-2})
#   LLAMA_REF_ISA=native (default: GGML_NATIVE=ON, this machine's best, for llama-bench) or
#   avx2 (GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C, BMI2 and no AVX-512: the ISA level the
#   spec's numerics describe, for golden files that do not depend on the CPU's AVX-512).
#   LLAMA_REF_TARGETS: the ninja targets (default: llama llama-tokenize llama-completion
#   llama-bench ggml-rpc-server; "llama" alone is enough for make-goldens.sh).
# Prints SCRATCH_DIR on its last line. Afterwards:
#   SCRATCH_DIR/build/bin/{llama-tokenize,llama-completion,llama-bench,ggml-rpc-server}
#   SCRATCH_DIR/build/bin/libllama.so (+ libggml*.so), headers under SCRATCH_DIR/src/include
#   and SCRATCH_DIR/src/ggml/include.
# Cache: when SCRATCH_DIR/.build-stamp names the pinned sdist and the ISA, the existing build
# tree is reused and ninja builds only what is missing or stale.
# Cost: ~1 min download (76.6 MB), then ~16 min of compiling on 2 idle cores for all targets
# (Release; the native build is for this machine's CPU only).
set -euo pipefail

# shellcheck source=.ci/ggml-sdist.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../.ci/ggml-sdist.sh"
read -r -a TARGETS <<< "${LLAMA_REF_TARGETS:-llama llama-tokenize llama-completion llama-bench ggml-rpc-server}"
case ${LLAMA_REF_ISA:-native} in
    native) ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
    avx2) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                     -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF) ;;
    *) echo "LLAMA_REF_ISA must be native or avx2" >&2; exit 2 ;;
esac
STAMP="$GGML_SDIST_SHA256 ${LLAMA_REF_ISA:-native}"
DIR=${LLAMA_REF_DIR:-$HOME/.cache/llama-ref}
[[ ${LLAMA_REF_ISA:-native} == native ]] || DIR=$DIR-${LLAMA_REF_ISA}
DIR=${1:-$DIR}

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
if [[ -f $DIR/.build-stamp && $(cat "$DIR/.build-stamp") == "$STAMP" && -f $DIR/build/build.ninja ]]; then
    # Configured for this sdist and ISA: build what is missing (a no-op when up to date).
    ninja -C "$DIR/build" -j"${LLAMA_REF_JOBS:-2}" "${TARGETS[@]}" >&2
    echo "$DIR"
    exit 0
fi

ggml_build_tools
rm -f "$DIR/.build-stamp"
ggml_sdist_unpack "$DIR"   # also removes $DIR/build
rm -rf "$DIR/src" "$DIR/ggml-src"
cp -r "$GGML_SDIST_TREE" "$DIR/src"
echo "$STAMP" > "$DIR/.build-stamp"
cmake -S "$DIR/src" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON "${ISA_FLAGS[@]}" -DGGML_RPC=ON -DGGML_CCACHE=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF >&2
ninja -C "$DIR/build" -j"${LLAMA_REF_JOBS:-2}" "${TARGETS[@]}" >&2
echo "$DIR"
