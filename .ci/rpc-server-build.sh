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

SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
RPC_DIR=${1:-${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}}
BIN=$RPC_DIR/bin/rpc-server

if [[ -x $BIN && -f $RPC_DIR/.sdist-sha256 && $(cat "$RPC_DIR/.sdist-sha256") == "$SDIST_SHA256" ]]; then
    echo "cached: $BIN" >&2
    echo "$BIN"
    exit 0
fi

if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    echo "installing cmake and ninja-build" >&2
    SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake ninja-build >&2
fi

mkdir -p "$RPC_DIR/dl" "$RPC_DIR/bin" "$RPC_DIR/rpc-tool"
cd "$RPC_DIR"
TARBALL=dl/llama_cpp_python-$SDIST_VERSION.tar.gz
if [[ ! -f $TARBALL ]]; then
    python3 -m pip download --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$SDIST_VERSION" -d dl >&2
fi
echo "$SDIST_SHA256  $TARBALL" | sha256sum -c - >&2
rm -rf "dl/llama_cpp_python-$SDIST_VERSION" ggml-src build install
tar xzf "$TARBALL" -C dl
V=dl/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp
cp -r "$V/ggml" ggml-src
cp "$V/tools/rpc/rpc-server.cpp" rpc-tool/
# The sdist omits ggml/ggml.pc.in, which ggml's standalone CMakeLists needs (pkg-config template).
cat > ggml-src/ggml.pc.in <<'PC'
prefix=@CMAKE_INSTALL_PREFIX@
exec_prefix=${prefix}
includedir=${prefix}/include
libdir=${prefix}/lib

Name: ggml
Description: The GGML Tensor Library for Machine Learning
Version: @GGML_VERSION@
Cflags: -I${includedir}
Libs: -L${libdir} -lggml
PC
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
