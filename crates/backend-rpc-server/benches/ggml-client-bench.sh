#!/usr/bin/env bash
# Build the ggml-client side of benches/rpc.rs: a small C++ driver over ggml's own RPC client
# (ggml_backend_rpc_init), linked against the ggml that .ci/rpc-server-build.sh built, in the
# same scratch directory. Nothing built here is committed.
#
# Usage: benches/ggml-client-bench.sh [SCRATCH_DIR]
#   SCRATCH_DIR defaults to the directory above $RPC_SERVER_BIN's bin/, then
#   ${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}. Prints the driver's path on its last line.
#
# The driver connects to HOST:PORT (its argument), allocates one buffer holding a 1 MiB and a
# 64 MiB i8 tensor and a 16-float ADD, then reads commands on stdin, one per line:
#   set1 N | get1 N | set64 N | get64 N | graph N
# runs the operation N times and answers with the elapsed nanoseconds on one line. A set is
# followed by a 1-byte get and a graph compute by a 64-byte get of its result, so each
# iteration is a full round trip (exactly what the Rust side measures for our client).
set -euo pipefail

if [[ $# -ge 1 ]]; then
    RPC_DIR=$1
elif [[ -n ${RPC_SERVER_BIN:-} ]]; then
    RPC_DIR=$(cd "$(dirname "$RPC_SERVER_BIN")/.." && pwd)
else
    RPC_DIR=${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}
fi
[[ -f $RPC_DIR/install/include/ggml-rpc.h ]] || {
    echo "no ggml install under $RPC_DIR; run .ci/rpc-server-build.sh first" >&2
    exit 1
}
SRC=$RPC_DIR/rpc-tool/ggml_client_bench.cpp
BIN=$RPC_DIR/bin/ggml-client-bench
mkdir -p "$RPC_DIR/rpc-tool" "$RPC_DIR/bin"
cat > "$SRC.new" <<'CPP'
// Timing driver over ggml's RPC client; see backend-rpc-server/benches/ggml-client-bench.sh.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-rpc.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s HOST:PORT\n", argv[0]);
        return 2;
    }
    ggml_backend_t backend = ggml_backend_rpc_init(argv[1], 0);
    if (backend == nullptr) {
        std::fprintf(stderr, "cannot connect to %s\n", argv[1]);
        return 1;
    }
    ggml_init_params params = {8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * t1 = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 1 << 20);
    ggml_tensor * t64 = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 64 << 20);
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16);
    ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16);
    ggml_tensor * sum = ggml_add(ctx, a, b);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (buffer == nullptr) {
        std::fprintf(stderr, "cannot allocate the remote buffer\n");
        return 1;
    }
    ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, sum);
    std::vector<float> ab(16, 0.5f);
    ggml_backend_tensor_set(a, ab.data(), 0, sizeof(float) * 16);
    ggml_backend_tensor_set(b, ab.data(), 0, sizeof(float) * 16);

    std::vector<unsigned char> data(64 << 20, 7);
    std::vector<unsigned char> back(64 << 20);
    float out[16];
    std::cout << "ready" << std::endl;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string op;
        long iters = 0;
        in >> op >> iters;
        auto start = std::chrono::steady_clock::now();
        for (long i = 0; i < iters; ++i) {
            if (op == "set1" || op == "set64") {
                ggml_tensor * t = op == "set1" ? t1 : t64;
                ggml_backend_tensor_set(t, data.data(), 0, ggml_nbytes(t));
                ggml_backend_tensor_get(t, back.data(), 0, 1);
            } else if (op == "get1" || op == "get64") {
                ggml_tensor * t = op == "get1" ? t1 : t64;
                ggml_backend_tensor_get(t, back.data(), 0, ggml_nbytes(t));
            } else if (op == "graph") {
                ggml_backend_graph_compute(backend, graph);
                ggml_backend_tensor_get(sum, out, 0, sizeof(out));
            } else {
                std::cerr << "unknown command " << op << std::endl;
                return 2;
            }
        }
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
        if (op == "graph" && out[0] != 1.0f) {
            std::cerr << "wrong ADD result " << out[0] << std::endl;
            return 1;
        }
        std::cout << ns << std::endl;
    }
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(backend);
    ggml_free(ctx);
    return 0;
}
CPP
if [[ -x $BIN && -f $SRC ]] && cmp -s "$SRC" "$SRC.new"; then
    rm "$SRC.new"
    echo "cached: $BIN" >&2
    echo "$BIN"
    exit 0
fi
mv "$SRC.new" "$SRC"
LIBS="-L$RPC_DIR/install/lib -lggml -lggml-rpc -lggml-cpu -lggml-base -lpthread -lm"
# shellcheck disable=SC2086
g++ -O2 -std=c++17 -I "$RPC_DIR/install/include" "$SRC" -o "$BIN" $LIBS
echo "$BIN"
