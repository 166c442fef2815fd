#!/usr/bin/env bash
# Build ggml's CPU backend in its default build for this machine (GGML_NATIVE=ON, ggml's own
# defaults otherwise) from the PyPI sdist llama-cpp-python==0.3.36 (the ggml that
# .ci/rpc-server-build.sh uses), plus a tiny C++ driver that times MUL_MAT on it, so that
# `benches/kernels.rs` can be compared with ggml on the same machine in the same minute.
# Nothing built here is committed.
#
# Usage: crates/cpu-kernels/benches/ggml-matvec-bench.sh [SCRATCH_DIR] [-- DRIVER ARGS]
#   SCRATCH_DIR defaults to ${GGML_MATVEC_DIR:-$HOME/.cache/ggml-matvec}.
#   Builds (cached by sdist hash and driver source), then runs the driver:
#     ggml-matvec [ITERS] [THREADS]      (defaults 200 and 2)
#   which prints one line per case: `NAME MIN_NS GFLOP/s MEAN_NS`: the fastest single call
#   (what benches/kernels.rs reports with BENCH_MIN=1) and the mean of the best of 5 rounds
#   of ITERS calls (after a warm-up round; ITERS/8 for the x32 shapes, ITERS/64 for x512).
#   Cases: f32_4096x4096_x1, q4_0_4096x4096_x1, f32_4096x4096_x32, q4_0_4096x4096_x32,
#   q4_0_4096x4096_x512 (the names of benches/kernels.rs's mul_mat group), and the three
#   q4_0 shapes again as *_repack with the weights in ggml's CPU_REPACK buffer type (the
#   interleaved layout and gemm kernels llama.cpp uses for q4_0 weights on this CPU), then
#   q4_1_4096x4096_x{1,32,512} and q8_0_4096x4096_x{1,32,512} (ggml 0.25.3 has no q4_1 or
#   q8_0 repacked layout on x86: its default path). GGML_MATVEC_ONLY=PREFIX runs only the cases whose name starts with PREFIX.
#   On a CPU with AMX-INT8 (Sapphire Rapids and later) ggml's CPU device offers a second
#   extra buffer type, AMX, ahead of CPU_REPACK: it is what llama.cpp gives q4_0, q4_1 and
#   q8_0 weights there. Its cases (q4_0, q4_1 and q8_0 ×1, ×32, ×512 as *_amx) run last, each
#   in a process of its own, because ggml 0.25.3's AMX product crashed on such a host (its
#   ×32 and ×512 products died with SIGILL, once SIGSEGV; llama-bench segfaulted in
#   ggml_backend_amx_mul_mat on SmolLM2's prompt): a case that dies prints
#   `NAME crashed (exit status N)`.
#   With BENCH_LARGE set (as for the Rust bench) f32_4096x4096x4096 comes first (one call
#   per round).
#   Weights and inputs are filled with the byte 0x3c, as the Rust bench does.
#   GGML_MATVEC_SGEMM=1 builds ggml with its optional llamafile sgemm (GGML_LLAMAFILE=ON) in
#   SCRATCH_DIR-sgemm instead: the "optional" build the f32 4096³ figure is compared with.
# Cost: ~1 min download (76.6 MB), ~1-2 min build on 2 cores, `apt-get install cmake ninja-build`.
set -euo pipefail

# shellcheck source=.ci/ggml-sdist.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../.ci/ggml-sdist.sh"
SDIST_SHA256=$GGML_SDIST_SHA256
DIR=${GGML_MATVEC_DIR:-$HOME/.cache/ggml-matvec}
if [[ $# -ge 1 && $1 != -- ]]; then DIR=$1; shift; fi
LLAMAFILE=OFF
if [[ -n ${GGML_MATVEC_SGEMM:-} ]]; then
    LLAMAFILE=ON
    DIR=$DIR-sgemm
fi
[[ ${1:-} == -- ]] && shift
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
BIN=$DIR/bin/ggml-matvec
SRC=$DIR/driver/ggml_matvec.cpp

ggml_build_tools

mkdir -p "$DIR/dl" "$DIR/bin" "$DIR/driver"
cd "$DIR"
if [[ ! -f install/lib/libggml-cpu.a || $(cat .sdist-sha256 2>/dev/null) != "$SDIST_SHA256" ]]; then
    ggml_sdist_unpack "$DIR"
    # ggml's defaults (OpenMP if the compiler has it, no llamafile sgemm unless asked, no
    # BLAS), tuned for this CPU: the build a user of ggml gets by default.
    cmake -S ggml-src -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=ON -DGGML_LLAMAFILE="$LLAMAFILE" \
        -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF \
        -DCMAKE_INSTALL_PREFIX="$DIR/install" >&2
    ninja -C build -j"${GGML_BUILD_JOBS:-2}" >&2
    cmake --install build >&2
    echo "$SDIST_SHA256" > .sdist-sha256
    rm -f "$BIN"
fi

cat > "$SRC.new" <<'CPP'
// Times ggml's CPU backend on MUL_MAT; see cpu-kernels/benches/ggml-matvec-bench.sh.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

// `buft`: the weights live in the CPU device's extra buffer type of that name (CPU_REPACK
// interleaves q4_0 rows for its gemm kernels; AMX, on CPUs with AMX-INT8, lays blocks out for
// its tile kernels); nullptr: in the CPU buffer.
struct Case { const char * name; ggml_type ty; int k, m, n; const char * buft; };

int main(int argc, char ** argv) {
    long iters = argc > 1 ? std::atol(argv[1]) : 200;
    int threads = argc > 2 ? std::atoi(argv[2]) : 2;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (cpu == nullptr) { std::fprintf(stderr, "no CPU backend\n"); return 1; }
    ggml_backend_cpu_set_n_threads(cpu, threads);
    const Case cases[] = {
        {"f32_4096x4096_x1", GGML_TYPE_F32, 4096, 4096, 1, nullptr},
        {"q4_0_4096x4096_x1", GGML_TYPE_Q4_0, 4096, 4096, 1, nullptr},
        {"f32_4096x4096_x32", GGML_TYPE_F32, 4096, 4096, 32, nullptr},
        {"q4_0_4096x4096_x32", GGML_TYPE_Q4_0, 4096, 4096, 32, nullptr},
        {"q4_0_4096x4096_x512", GGML_TYPE_Q4_0, 4096, 4096, 512, nullptr},
        {"q4_0_4096x4096_x1_repack", GGML_TYPE_Q4_0, 4096, 4096, 1, "CPU_REPACK"},
        {"q4_0_4096x4096_x32_repack", GGML_TYPE_Q4_0, 4096, 4096, 32, "CPU_REPACK"},
        {"q4_0_4096x4096_x512_repack", GGML_TYPE_Q4_0, 4096, 4096, 512, "CPU_REPACK"},
        // No q4_1 layout in this ggml's CPU_REPACK (x86): its default path is what llama.cpp
        // runs q4_1 weights with here (without AMX).
        {"q4_1_4096x4096_x1", GGML_TYPE_Q4_1, 4096, 4096, 1, nullptr},
        {"q4_1_4096x4096_x32", GGML_TYPE_Q4_1, 4096, 4096, 32, nullptr},
        {"q4_1_4096x4096_x512", GGML_TYPE_Q4_1, 4096, 4096, 512, nullptr},
        // Nor a q8_0 one: the default path again.
        {"q8_0_4096x4096_x1", GGML_TYPE_Q8_0, 4096, 4096, 1, nullptr},
        {"q8_0_4096x4096_x32", GGML_TYPE_Q8_0, 4096, 4096, 32, nullptr},
        {"q8_0_4096x4096_x512", GGML_TYPE_Q8_0, 4096, 4096, 512, nullptr},
        // Only run when asked for by name (GGML_MATVEC_ONLY), one per process: see above.
        {"q4_0_4096x4096_x1_amx", GGML_TYPE_Q4_0, 4096, 4096, 1, "AMX"},
        {"q4_0_4096x4096_x32_amx", GGML_TYPE_Q4_0, 4096, 4096, 32, "AMX"},
        {"q4_0_4096x4096_x512_amx", GGML_TYPE_Q4_0, 4096, 4096, 512, "AMX"},
        {"q4_1_4096x4096_x1_amx", GGML_TYPE_Q4_1, 4096, 4096, 1, "AMX"},
        {"q4_1_4096x4096_x32_amx", GGML_TYPE_Q4_1, 4096, 4096, 32, "AMX"},
        {"q4_1_4096x4096_x512_amx", GGML_TYPE_Q4_1, 4096, 4096, 512, "AMX"},
        {"q8_0_4096x4096_x1_amx", GGML_TYPE_Q8_0, 4096, 4096, 1, "AMX"},
        {"q8_0_4096x4096_x32_amx", GGML_TYPE_Q8_0, 4096, 4096, 32, "AMX"},
        {"q8_0_4096x4096_x512_amx", GGML_TYPE_Q8_0, 4096, 4096, 512, "AMX"},
    };
    ggml_backend_dev_t dev = ggml_backend_get_device(cpu);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t * extra = get_extra ? get_extra(dev) : nullptr;
    std::vector<Case> todo(std::begin(cases), std::end(cases));
    if (std::getenv("BENCH_LARGE") != nullptr) {
        todo.insert(todo.begin(), {"f32_4096x4096x4096", GGML_TYPE_F32, 4096, 4096, 4096, nullptr});
    }
    const char * only = std::getenv("GGML_MATVEC_ONLY");
    for (const Case & c : todo) {
        if (only != nullptr && std::strncmp(c.name, only, std::strlen(only)) != 0) {
            continue;
        }
        bool amx = c.buft != nullptr && std::strcmp(c.buft, "AMX") == 0;
        if (amx && (only == nullptr || std::strcmp(c.name, only) != 0)) {
            continue;
        }
        ggml_backend_buffer_type_t wbuft = nullptr;
        for (ggml_backend_buffer_type_t * e = extra; c.buft != nullptr && e && *e; ++e) {
            if (std::strcmp(ggml_backend_buft_name(*e), c.buft) == 0) wbuft = *e;
        }
        if (c.buft != nullptr && wbuft == nullptr) {
            std::printf("%s (no %s buffer type)\n", c.name, c.buft);
            continue;
        }
        bool repack = wbuft != nullptr;
        ggml_init_params params = {8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
        ggml_context * ctx = ggml_init(params);
        ggml_context * wctx = ggml_init(params);
        ggml_tensor * w = ggml_new_tensor_2d(repack ? wctx : ctx, c.ty, c.k, c.m);
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.k, c.n);
        ggml_tensor * y = ggml_mul_mat(ctx, w, x);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
        ggml_backend_buffer_clear(buf, 0x3c);
        ggml_backend_buffer_t wbuf = nullptr;
        if (repack) {
            // Repacking happens in set_tensor, so the weights are written, not cleared.
            wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
            std::vector<unsigned char> bytes(ggml_nbytes(w), 0x3c);
            ggml_backend_tensor_set(w, bytes.data(), 0, bytes.size());
        }
        ggml_cgraph * g = ggml_new_graph(ctx);
        ggml_build_forward_expand(g, y);
        // Small enough shapes run more iterations per round for the same time.
        long n_it = c.n > 512 ? 1 : c.n > 32 ? iters / 64 + 1 : c.n > 1 ? iters / 8 + 1 : iters;
        double best = 1e300, fastest = 1e300;
        for (int round = 0; round < 6; ++round) {
            auto t0 = std::chrono::steady_clock::now();
            for (long i = 0; i < n_it; ++i) {
                auto c0 = std::chrono::steady_clock::now();
                if (ggml_backend_graph_compute(cpu, g) != GGML_STATUS_SUCCESS) {
                    std::fprintf(stderr, "compute failed\n");
                    return 1;
                }
                double one = std::chrono::duration<double, std::nano>(
                                 std::chrono::steady_clock::now() - c0).count();
                if (round > 0 && one < fastest) fastest = one;
            }
            double ns = std::chrono::duration<double, std::nano>(
                            std::chrono::steady_clock::now() - t0).count() / n_it;
            if (round > 0 && ns < best) best = ns;  // round 0 warms up
        }
        float out = 0;
        ggml_backend_tensor_get(y, &out, 0, sizeof(out));
        double flop = 2.0 * c.k * c.m * c.n;
        std::printf("%s %.0f %.2f %.0f (y[0]=%g)\n", c.name, fastest, flop / fastest, best, out);
        std::fflush(stdout);
        ggml_backend_buffer_free(buf);
        if (wbuf) ggml_backend_buffer_free(wbuf);
        ggml_free(ctx);
        ggml_free(wctx);
    }
    ggml_backend_free(cpu);
    return 0;
}
CPP
# OpenMP: ggml-cpu uses it in its default build when the compiler has it.
ggml_build_driver "$SRC" "$BIN" g++ -O2 -std=c++17 -fopenmp -I "$DIR/install/include" "$SRC" \
    -o "$BIN" -L"$DIR/install/lib" -lggml -lggml-cpu -lggml-base -lpthread -lm
echo "$BIN" >&2
if [[ -n ${GGML_MATVEC_ONLY:-} ]]; then
    exec "$BIN" "$@"
fi
"$BIN" "$@"
if grep -qw amx_int8 /proc/cpuinfo; then
    for c in q4_0 q4_1 q8_0; do
        for n in 1 32 512; do
            name=${c}_4096x4096_x${n}_amx
            status=0
            GGML_MATVEC_ONLY=$name "$BIN" "$@" 2>/dev/null || status=$?
            [[ $status -eq 0 ]] || echo "$name crashed (exit status $status)"
        done
    done
fi
