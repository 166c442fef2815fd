#!/usr/bin/env bash
# Build ggml's real rpc-server (RPC protocol 7.0.0, ggml 0.25.3) from the PyPI sdist
# llama-cpp-python==0.3.36, in a scratch directory, for backend-rpc's interop tests.
#
# Nothing built here is committed: the sdist is downloaded and built at CI time only.
# Usage:  .ci/rpc-server-build.sh [SCRATCH_DIR]   (default: ${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server})
# Prints the path of the binary on its last line; export it as RPC_SERVER_BIN.
# Cache: if SCRATCH_DIR/bin/rpc-server exists and the sdist hash matches, nothing is rebuilt.
# Cost: ~1 min download (76.6 MB), ~26 s build on 2 cores, plus `apt-get install cmake ninja-build`.
set -euo pipefail

# shellcheck source=.ci/ggml-sdist.sh
source "$(dirname "${BASH_SOURCE[0]}")/ggml-sdist.sh"
SDIST_SHA256=$GGML_SDIST_SHA256
RPC_DIR=${1:-${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}}
BIN=$RPC_DIR/bin/rpc-server

if [[ -x $BIN && -f $RPC_DIR/.sdist-sha256 && $(cat "$RPC_DIR/.sdist-sha256") == "$SDIST_SHA256" ]]; then
    echo "cached: $BIN" >&2
    echo "$BIN"
    exit 0
fi

ggml_build_tools
mkdir -p "$RPC_DIR/bin" "$RPC_DIR/rpc-tool"
RPC_DIR=$(cd "$RPC_DIR" && pwd)
cd "$RPC_DIR"
ggml_sdist_unpack "$RPC_DIR"
cp "$GGML_SDIST_TREE/tools/rpc/rpc-server.cpp" rpc-tool/
cmake -S ggml-src -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF \
    -DCMAKE_INSTALL_PREFIX="$RPC_DIR/install" >&2
ninja -C build -j"${RPC_BUILD_JOBS:-2}" >&2
cmake --install build >&2
LIBS="-L$RPC_DIR/install/lib -lggml -lggml-rpc -lggml-cpu -lggml-base -lpthread -lm"
# shellcheck disable=SC2086
g++ -O2 -std=c++17 -I install/include rpc-tool/rpc-server.cpp -o "$BIN" $LIBS
echo "$SDIST_SHA256" > .sdist-sha256
echo "$BIN"
