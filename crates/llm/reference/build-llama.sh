#!/usr/bin/env bash
# Build llama.cpp (the tree vendored in the PyPI sdist llama-cpp-python==0.3.36, pinned and
# hash-checked by .ci/ggml-sdist.sh) in a scratch directory outside the repository: the
# reference for the llm crate's golden files (make-goldens.sh) and its speed comparison
# (llama-bench.sh). Nothing of llama.cpp is committed.
#
# Usage:  crates/llm/reference/build-llama.sh [SCRATCH_DIR]
#         (default: ${LLAMA_REF_DIR:-$HOME/.cache/llama-ref}; jobs: ${LLAMA_REF_JOBS:-2})
# Prints SCRATCH_DIR on its last line. Afterwards:
#   SCRATCH_DIR/build/bin/{llama-tokenize,llama-completion,llama-bench,ggml-rpc-server}
#   SCRATCH_DIR/build/bin/libllama.so (+ libggml*.so), headers under SCRATCH_DIR/src/include
#   and SCRATCH_DIR/src/ggml/include.
# Cache: nothing is rebuilt when SCRATCH_DIR/.sdist-sha256 matches the pinned sdist and the
# binaries exist.
# Cost: ~1 min download (76.6 MB), then ~16-25 min of compiling on 2 cores (Release,
# GGML_NATIVE=ON, so the binaries are for this machine's CPU only).
set -euo pipefail

# shellcheck source=.ci/ggml-sdist.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../.ci/ggml-sdist.sh"
DIR=${1:-${LLAMA_REF_DIR:-$HOME/.cache/llama-ref}}
TARGETS=(llama llama-tokenize llama-completion llama-bench ggml-rpc-server)

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
cached=1
for t in llama-tokenize llama-completion llama-bench ggml-rpc-server; do
    [[ -x $DIR/build/bin/$t ]] || cached=0
done
[[ -f $DIR/build/bin/libllama.so ]] || cached=0
if [[ $cached == 1 && -f $DIR/.sdist-sha256 && $(cat "$DIR/.sdist-sha256") == "$GGML_SDIST_SHA256" ]]; then
    echo "cached: $DIR" >&2
    echo "$DIR"
    exit 0
fi

ggml_build_tools
rm -f "$DIR/.sdist-sha256"
ggml_sdist_unpack "$DIR"   # also removes $DIR/build
rm -rf "$DIR/src" "$DIR/ggml-src"
cp -r "$GGML_SDIST_TREE" "$DIR/src"
cmake -S "$DIR/src" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_RPC=ON -DGGML_CCACHE=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF >&2
ninja -C "$DIR/build" -j"${LLAMA_REF_JOBS:-2}" "${TARGETS[@]}" >&2
echo "$GGML_SDIST_SHA256" > "$DIR/.sdist-sha256"
echo "$DIR"
