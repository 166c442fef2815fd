#!/usr/bin/env bash
# ggml's own scheduler on the graph of benches/sched.rs (case llama32/cpu), for a same-run
# comparison: a small C++ driver over ggml's ggml_backend_sched_*, linked against the ggml that
# .ci/rpc-server-build.sh builds from the PyPI sdist llama-cpp-python==0.3.36 (ggml 0.25.3), in
# the same scratch directory. Nothing built here is committed.
#
# Usage: crates/sched/benches/ggml-sched-bench.sh [GRAPH_FILE] [-- DRIVER_ARGS...]
#   Run from the repository root. GRAPH_FILE defaults to the bench's own graph, written by
#   `cargo run --release -p sched --example llama-graph` (LlamaConfig::llama_7b(32), one CPU
#   backend); its node and leaf order is then compared with ggml's, name by name.
#   Scratch dir: ${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}; run .ci/rpc-server-build.sh
#   first. Driver arguments: --iters N (calls per op and round, default 2000), --rounds R
#   (default 3), --order FILE (write ggml's node/leaf names in graph order), --nodes N
#   --leafs M (fail unless the graph has these counts), --fixture-device (see below),
#   --instr alloc|split|reserve (instruction counts, see below).
#
# The driver reads a graph file (shared/fixtures/FORMAT.md) with nlohmann/json (vendored in the
# sdist's llama.cpp tree), restricted to one backend of device type "cpu" (ggml's CPU backend),
# and builds it with ggml's op constructors (ggml_mul_mat, ggml_rope_ext, ggml_soft_max_ext,
# ggml_view_*, ggml_cpy, ...). The leaves with a "buffer" live in one real CPU buffer
# (ggml_backend_cpu_buffer_type, never touched, so it costs address space only) with the
# file's usage (weights). The graph is expanded from the file's "expand" list with
# ggml_new_graph_custom(graph_size). It prints the node/leaf counts, then for each op the mean
# and median ns per call over --iters calls, per round:
#   alloc   = ggml_backend_sched_reset + ggml_backend_sched_alloc_graph
#   split   = ggml_backend_sched_reset + ggml_backend_sched_split_graph
#   reserve = ggml_backend_sched_reserve
# ggml_backend_sched_split_graph is public API in ggml 0.25.3 (ggml-backend.h; it was static in
# the 2024-11 seed), so the driver calls it straight from the library. As in benches/sched.rs,
# every call is timed alone (std::chrono::steady_clock) and starts from a freshly built graph:
# before each call, untimed, every tensor's buffer and data pointers are put back to what they
# were right after building (the scheduler's own tensors live in its context, which
# split_graph re-initialises itself). Warm-up: 3 rounds of alloc + reserve, as in the Rust bench.
#
# Backend: ggml's real CPU backend (ggml_backend_cpu_init). Our bench runs the scheduler over
# the planning-only fixture CPU device (sched::fixture), whose supports_op is a bit test; ggml's
# CPU device checks extra buffer types and type traits in every supports_op call. With
# --fixture-device the driver swaps the CPU device's supports_op / supports_buft for the
# fixture's answers ("all" ops; own or host buffer types), so that both sides pay the same
# backend-query cost and only the schedulers differ.
#
# Instruction counts (load-independent, like SCHED_INSTR in benches/sched.rs): --instr OP runs
# OP 100 times through an out-of-line `measured_call`, so
#   valgrind --tool=callgrind --collect-atstart=no --toggle-collect=measured_call \
#       ~/.cache/ggml-rpc-server/bin/ggml-sched-bench GRAPH_FILE --instr split
# collects exactly those calls; instructions per call = the total (callgrind_annotate) / 100.
set -euo pipefail

# shellcheck source=.ci/ggml-sdist.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../.ci/ggml-sdist.sh"

GRAPH=""
if [[ $# -ge 1 && $1 != "--" ]]; then
    GRAPH=$1
    shift
fi
[[ ${1:-} == "--" ]] && shift

RPC_DIR=${RPC_BUILD_DIR:-$HOME/.cache/ggml-rpc-server}
SDIST=$RPC_DIR/dl/llama_cpp_python-0.3.36
[[ -f $RPC_DIR/install/include/ggml-backend.h && -f $RPC_DIR/ggml-src/src/ggml-impl.h ]] || {
    echo "no ggml install under $RPC_DIR; run .ci/rpc-server-build.sh first" >&2
    exit 1
}
if [[ ! -f $SDIST/vendor/llama.cpp/vendor/nlohmann/json.hpp ]]; then
    tar xzf "$RPC_DIR/dl/llama_cpp_python-0.3.36.tar.gz" -C "$RPC_DIR/dl"
fi
TOOL=$RPC_DIR/sched-tool
SRC=$TOOL/ggml_sched_bench.cpp
BIN=$RPC_DIR/bin/ggml-sched-bench
mkdir -p "$TOOL/nlohmann" "$RPC_DIR/bin"
cp "$SDIST/vendor/llama.cpp/vendor/nlohmann/json.hpp" "$TOOL/nlohmann/json.hpp"

cat > "$SRC.new" <<'CPP'
// Timing driver over ggml's scheduler; see sched/benches/ggml-sched-bench.sh.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-impl.h" // struct ggml_cgraph: n_leafs has no public accessor
#include "ggml-backend-impl.h" // struct ggml_backend_device, for --fixture-device

#include "nlohmann/json.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using json = nlohmann::json;

static ggml_type parse_type(const std::string & s) {
    if (s == "f32") return GGML_TYPE_F32;
    if (s == "f16") return GGML_TYPE_F16;
    if (s == "bf16") return GGML_TYPE_BF16;
    if (s == "i32") return GGML_TYPE_I32;
    if (s == "q8_0") return GGML_TYPE_Q8_0;
    if (s == "q4_0") return GGML_TYPE_Q4_0;
    throw std::runtime_error("unknown type " + s);
}

static std::vector<int64_t> ne_of(const json & t) {
    std::vector<int64_t> ne = t.at("ne").get<std::vector<int64_t>>();
    if (ne.empty() || ne.size() > 4) throw std::runtime_error(t.at("name").get<std::string>() + ": ne needs 1 to 4 extents");
    return ne;
}

static float num(const json & t, const char * k, float def) {
    return t.contains(k) ? t.at(k).get<float>() : def;
}

static ggml_tensor * build_op(ggml_context * ctx, const json & t, const std::vector<ggml_tensor *> & s) {
    const std::string op = t.at("op");
    const std::string name = t.at("name");
    auto need = [&](size_t n) {
        if (s.size() < n) throw std::runtime_error(name + ": " + op + " needs " + std::to_string(n) + " sources");
    };
    if (op == "ADD") { need(2); return ggml_add(ctx, s[0], s[1]); }
    if (op == "SUB") { need(2); return ggml_sub(ctx, s[0], s[1]); }
    if (op == "MUL") { need(2); return ggml_mul(ctx, s[0], s[1]); }
    if (op == "DIV") { need(2); return ggml_div(ctx, s[0], s[1]); }
    if (op == "SCALE") { need(1); return ggml_scale(ctx, s[0], num(t, "scale", 1.0f)); }
    if (op == "MUL_MAT") { need(2); return ggml_mul_mat(ctx, s[0], s[1]); }
    if (op == "GET_ROWS") { need(2); return ggml_get_rows(ctx, s[0], s[1]); }
    if (op == "RMS_NORM") { need(1); return ggml_rms_norm(ctx, s[0], num(t, "eps", 1e-5f)); }
    if (op == "NORM") { need(1); return ggml_norm(ctx, s[0], num(t, "eps", 1e-5f)); }
    if (op == "SOFT_MAX") {
        need(1);
        return ggml_soft_max_ext(ctx, s[0], s.size() > 1 ? s[1] : nullptr, num(t, "scale", 1.0f), num(t, "max_bias", 0.0f));
    }
    if (op == "ROPE") {
        need(2);
        // llama.cpp's defaults for the scalar parameters; they do not affect scheduling
        return ggml_rope_ext(ctx, s[0], s[1], nullptr, t.at("n_dims").get<int>(), t.value("mode", 0),
                             0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    }
    if (op == "UNARY") {
        need(1);
        const std::string u = t.at("unary");
        if (u == "SILU") return ggml_silu(ctx, s[0]);
        if (u == "GELU") return ggml_gelu(ctx, s[0]);
        if (u == "RELU") return ggml_relu(ctx, s[0]);
        throw std::runtime_error(name + ": unknown unary " + u);
    }
    if (op == "CONT") { need(1); return ggml_cont(ctx, s[0]); }
    if (op == "DUP") { need(1); return ggml_dup(ctx, s[0]); }
    if (op == "CPY") { need(2); return ggml_cpy(ctx, s[0], s[1]); }
    if (op == "TRANSPOSE") { need(1); return ggml_transpose(ctx, s[0]); }
    if (op == "PERMUTE") {
        need(1);
        auto a = t.at("axes").get<std::vector<int>>();
        if (a.size() != 4) throw std::runtime_error(name + ": axes needs 4 entries");
        return ggml_permute(ctx, s[0], a[0], a[1], a[2], a[3]);
    }
    if (op == "RESHAPE") {
        need(1);
        auto ne = ne_of(t);
        switch (ne.size()) {
            case 1: return ggml_reshape_1d(ctx, s[0], ne[0]);
            case 2: return ggml_reshape_2d(ctx, s[0], ne[0], ne[1]);
            case 3: return ggml_reshape_3d(ctx, s[0], ne[0], ne[1], ne[2]);
            default: return ggml_reshape_4d(ctx, s[0], ne[0], ne[1], ne[2], ne[3]);
        }
    }
    if (op == "VIEW") {
        need(1);
        auto ne = ne_of(t);
        size_t nb[4];
        nb[0] = ggml_type_size(s[0]->type);
        nb[1] = ggml_row_size(s[0]->type, ne[0]);
        for (int i = 2; i < 4; i++) nb[i] = nb[i - 1] * (i - 1 < (int) ne.size() ? ne[i - 1] : 1);
        if (t.contains("nb")) {
            auto v = t.at("nb").get<std::vector<size_t>>();
            if (v.size() != 4) throw std::runtime_error(name + ": nb needs 4 entries");
            for (int i = 1; i < 4; i++) nb[i] = v[i];
        }
        size_t off = t.value("offset", (size_t) 0);
        switch (ne.size()) {
            case 1: return ggml_view_1d(ctx, s[0], ne[0], off);
            case 2: return ggml_view_2d(ctx, s[0], ne[0], ne[1], nb[1], off);
            case 3: return ggml_view_3d(ctx, s[0], ne[0], ne[1], ne[2], nb[1], nb[2], off);
            default: return ggml_view_4d(ctx, s[0], ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], off);
        }
    }
    throw std::runtime_error(name + ": unsupported op " + op);
}

// --fixture-device: the CPU device answers supports_op / supports_buft as the project's
// fixture CPU device does for `"supports_ops": "all"` (every op; its own buffer type or any
// host buffer type), instead of ggml-cpu's per-op checks (extra buffer types, type traits).
static ggml_backend_buffer_type_t g_cpu_buft;
static bool fixture_supports_op(ggml_backend_dev_t, const ggml_tensor *) { return true; }
static bool fixture_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
    return buft == g_cpu_buft || ggml_backend_buft_is_host(buft);
}

// One call, kept out of line so that `valgrind --tool=callgrind --collect-atstart=no
// --toggle-collect=measured_call` counts exactly the measured work (--instr OP).
extern "C" __attribute__((noinline)) void measured_call(void (*f)(ggml_backend_sched_t, ggml_cgraph *),
                                                        ggml_backend_sched_t s, ggml_cgraph * g) {
    f(s, g);
    __asm__ volatile("" ::: "memory");
}

struct Fresh {
    ggml_tensor * t;
    ggml_backend_buffer_t buffer;
    void * data;
};

static void usage(const char * argv0) {
    std::fprintf(stderr, "usage: %s GRAPH_FILE [--iters N] [--rounds R] [--order FILE] [--nodes N] [--leafs M] [--fixture-device] [--instr alloc|split|reserve]\n", argv0);
    std::exit(2);
}

int main(int argc, char ** argv) try {
    if (argc < 2) usage(argv[0]);
    std::string path = argv[1];
    long iters = 2000, rounds = 3, want_nodes = -1, want_leafs = -1;
    std::string order_path, instr;
    bool fixture_device = false;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--fixture-device") {
            fixture_device = true;
            continue;
        }
        if (i + 1 >= argc) usage(argv[0]);
        std::string v = argv[++i];
        if (a == "--iters") iters = std::stol(v);
        else if (a == "--rounds") rounds = std::stol(v);
        else if (a == "--order") order_path = v;
        else if (a == "--nodes") want_nodes = std::stol(v);
        else if (a == "--leafs") want_leafs = std::stol(v);
        else if (a == "--instr") instr = v;
        else usage(argv[0]);
    }

    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    json f = json::parse(in);
    const auto & backends = f.at("backends");
    if (backends.size() != 1 || backends[0].at("device_type") != "cpu") {
        throw std::runtime_error("this driver runs only graph files with one backend of device type cpu");
    }
    const std::string cpu_name = backends[0].at("name");
    if (f.contains("assign") && !f.at("assign").empty()) throw std::runtime_error("assign is not supported");
    const bool parallel = f.value("parallel", false);
    const size_t graph_size = f.at("graph_size");
    const auto & tensors = f.at("tensors");

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) throw std::runtime_error("ggml_backend_cpu_init failed");
    static ggml_backend_device fixture_dev;
    if (fixture_device) {
        g_cpu_buft = ggml_backend_get_default_buffer_type(backend);
        fixture_dev = *backend->device;
        fixture_dev.iface.supports_op = fixture_supports_op;
        fixture_dev.iface.supports_buft = fixture_supports_buft;
        backend->device = &fixture_dev;
    }

    // pre-allocated leaves in their own context, allocated first (as the fixture builder does)
    ggml_init_params wp = {(tensors.size() + 16) * ggml_tensor_overhead(), nullptr, true};
    ggml_context * ctx_w = ggml_init(wp);
    ggml_init_params cp = {(tensors.size() + 16) * ggml_tensor_overhead() + ggml_graph_overhead_custom(graph_size, false), nullptr, true};
    ggml_context * ctx = ggml_init(cp);

    std::map<std::string, ggml_tensor *> names;
    std::string usage_name;
    bool any_buffer = false;
    for (const auto & t : tensors) {
        if (t.contains("op")) continue;
        const std::string name = t.at("name");
        if (names.count(name)) throw std::runtime_error("duplicate tensor name " + name);
        auto ne = ne_of(t);
        ne.resize(4, 1);
        const bool in_buffer = t.contains("buffer");
        if (in_buffer) {
            if (t.at("buffer") != cpu_name) throw std::runtime_error(name + ": buffer other than the CPU backend's");
            std::string u = t.value("usage", std::string("weights"));
            if (any_buffer && u != usage_name) throw std::runtime_error("buffer " + cpu_name + ": tensors disagree on usage");
            usage_name = u;
            any_buffer = true;
        }
        ggml_tensor * x = ggml_new_tensor(in_buffer ? ctx_w : ctx, parse_type(t.at("type")), 4, ne.data());
        ggml_set_name(x, name.c_str());
        names[name] = x;
    }
    ggml_backend_buffer_t wbuf = nullptr;
    if (any_buffer) {
        wbuf = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, ggml_backend_cpu_buffer_type());
        if (!wbuf) throw std::runtime_error("cannot allocate the weights buffer");
        ggml_backend_buffer_usage u = usage_name == "weights" ? GGML_BACKEND_BUFFER_USAGE_WEIGHTS
                                    : usage_name == "compute" ? GGML_BACKEND_BUFFER_USAGE_COMPUTE
                                    : usage_name == "any"     ? GGML_BACKEND_BUFFER_USAGE_ANY
                                    : throw std::runtime_error("unknown usage " + usage_name);
        ggml_backend_buffer_set_usage(wbuf, u);
    }
    for (const auto & t : tensors) {
        if (!t.contains("op")) continue;
        const std::string name = t.at("name");
        if (names.count(name)) throw std::runtime_error("duplicate tensor name " + name);
        std::vector<ggml_tensor *> src;
        for (const auto & s : t.value("src", json::array())) {
            auto it = names.find(s.get<std::string>());
            if (it == names.end()) throw std::runtime_error(name + ": unknown source " + s.get<std::string>());
            src.push_back(it->second);
        }
        ggml_tensor * x = build_op(ctx, t, src);
        ggml_set_name(x, name.c_str());
        names[name] = x;
    }
    for (const auto & t : tensors) {
        ggml_tensor * x = names.at(t.at("name"));
        for (const auto & fl : t.value("flags", json::array())) {
            if (fl == "input") ggml_set_input(x);
            else if (fl == "output") ggml_set_output(x);
            else throw std::runtime_error("unknown flag " + fl.get<std::string>());
        }
    }
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, graph_size, false);
    for (const auto & e : f.at("expand")) {
        auto it = names.find(e.get<std::string>());
        if (it == names.end()) throw std::runtime_error("expand: unknown tensor " + e.get<std::string>());
        ggml_build_forward_expand(gf, it->second);
    }
    std::printf("graph %s: %d nodes, %d leafs\n", path.c_str(), gf->n_nodes, gf->n_leafs);
    if (!order_path.empty()) {
        std::ofstream o(order_path);
        o << "nodes " << gf->n_nodes << " leafs " << gf->n_leafs << "\n";
        for (int i = 0; i < gf->n_nodes; i++) o << "node " << gf->nodes[i]->name << "\n";
        for (int i = 0; i < gf->n_leafs; i++) o << "leaf " << gf->leafs[i]->name << "\n";
    }
    if ((want_nodes >= 0 && want_nodes != gf->n_nodes) || (want_leafs >= 0 && want_leafs != gf->n_leafs)) {
        std::fprintf(stderr, "expected %ld nodes and %ld leafs\n", want_nodes, want_leafs);
        return 1;
    }

    // the freshly built state of every tensor of ours
    std::vector<Fresh> fresh;
    for (ggml_context * c : {ctx_w, ctx}) {
        for (ggml_tensor * t = ggml_get_first_tensor(c); t; t = ggml_get_next_tensor(c, t)) {
            fresh.push_back({t, t->buffer, t->data});
        }
    }
    auto restore = [&] {
        for (auto & r : fresh) {
            r.t->buffer = r.buffer;
            r.t->data = r.data;
        }
    };

    ggml_backend_sched_t sched = ggml_backend_sched_new(&backend, nullptr, 1, graph_size, parallel, true);
    for (int i = 0; i < 3; i++) {
        restore();
        ggml_backend_sched_reset(sched);
        if (!ggml_backend_sched_alloc_graph(sched, gf)) throw std::runtime_error("alloc_graph failed");
        restore();
        if (!ggml_backend_sched_reserve(sched, gf)) throw std::runtime_error("reserve failed");
    }
    restore();
    ggml_backend_sched_reset(sched);
    ggml_backend_sched_alloc_graph(sched, gf);
    std::printf("device: %s\n", fixture_device ? "fixture (supports_op: every op)" : "ggml-cpu");
    std::printf("%d splits, compute buffer %zu bytes, sched graph_size %zu\n", ggml_backend_sched_get_n_splits(sched),
                ggml_backend_sched_get_buffer_size(sched, backend), graph_size);

    using clk = std::chrono::steady_clock;
    struct Case {
        const char * name;
        void (*f)(ggml_backend_sched_t, ggml_cgraph *);
    };
    const Case cases[] = {
        {"reset+alloc_graph", [](ggml_backend_sched_t s, ggml_cgraph * g) {
             ggml_backend_sched_reset(s);
             if (!ggml_backend_sched_alloc_graph(s, g)) std::abort();
         }},
        {"split", [](ggml_backend_sched_t s, ggml_cgraph * g) {
             ggml_backend_sched_reset(s);
             ggml_backend_sched_split_graph(s, g);
         }},
        {"reserve", [](ggml_backend_sched_t s, ggml_cgraph * g) {
             if (!ggml_backend_sched_reserve(s, g)) std::abort();
         }},
    };
    if (!instr.empty()) {
        const Case * c = instr == "alloc" ? &cases[0] : instr == "split" ? &cases[1] : instr == "reserve" ? &cases[2] : nullptr;
        if (!c) usage(argv[0]);
        for (int i = 0; i < 100; i++) {
            restore();
            measured_call(c->f, sched, gf);
        }
        std::printf("ran %s 100 times through measured_call\n", c->name);
        rounds = 0;
    }
    std::vector<double> ns(iters);
    for (long r = 0; r < rounds; r++) {
        for (const Case & c : cases) {
            double total = 0;
            for (long i = 0; i < iters; i++) {
                restore();
                auto t0 = clk::now();
                c.f(sched, gf);
                auto t1 = clk::now();
                ns[i] = std::chrono::duration<double, std::nano>(t1 - t0).count();
                total += ns[i];
            }
            std::sort(ns.begin(), ns.end());
            std::printf("ggml %-18s round %ld: mean %8.0f ns  median %8.0f ns  p10 %8.0f ns  (%ld calls)\n", c.name, r,
                        total / iters, ns[iters / 2], ns[iters / 10], iters);
            std::fflush(stdout);
        }
    }
    restore();
    ggml_backend_sched_free(sched);
    if (wbuf) ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    ggml_free(ctx_w);
    ggml_backend_free(backend);
    return 0;
} catch (const std::exception & e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
CPP
ggml_build_driver "$SRC" "$BIN" g++ -O2 -std=c++17 -I "$RPC_DIR/install/include" \
    -I "$RPC_DIR/ggml-src/src" -I "$TOOL" "$SRC" -o "$BIN" \
    -L"$RPC_DIR/install/lib" -lggml -lggml-cpu -lggml-base -lpthread -lm

if [[ -z $GRAPH ]]; then
    GRAPH=$TOOL/llama32.graph.json
    echo "writing $GRAPH (cargo run --release -p sched --example llama-graph)" >&2
    cargo run -q --release -p sched --example llama-graph -- --order "$TOOL/ours.order" > "$GRAPH"
    "$BIN" "$GRAPH" --rounds 0 --order "$TOOL/ggml.order" > /dev/null
    if cmp -s "$TOOL/ours.order" "$TOOL/ggml.order"; then
        echo "node and leaf order: identical to ours ($(head -1 "$TOOL/ours.order"))"
    else
        echo "node/leaf order differs from ours:" >&2
        diff "$TOOL/ours.order" "$TOOL/ggml.order" | head -20 >&2
        exit 1
    fi
fi
exec "$BIN" "$GRAPH" "$@"
