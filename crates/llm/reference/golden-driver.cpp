// Reference driver: writes the tokenizer and greedy-decoding golden files from llama.cpp's
// libllama (the build of crates/llm/reference/build-llama.sh). Built and run by
// make-goldens.sh; the files it writes are described in crates/llm/tests/golden/README.md.
//
//   golden-driver tokenize MODEL CORPUS.json OUT.jsonl
//       CORPUS.json is a JSON list of strings. For each text and parse_special in
//       (true, false) one line:
//       {"text", "parse_special", "ids", "detok"}
//   golden-driver greedy MODEL PROMPTS.json OUT.jsonl fa|nofa [N_NEW]
//       PROMPTS.json is a JSON list of {"chat": bool, "text": string}; chat texts are user
//       messages rendered as ChatML (default system turn first, then the user turn, then
//       the assistant header). One line per prompt:
//       {"prompt", "chat", "prompt_tokens", "tokens", "top5"}
//
// Decoding: one fresh context per prompt, n_ctx 512, n_batch = n_ubatch 512, 2 threads,
// F16 K/V cache, flash attention forced on or off; the prompt is one llama_decode with
// only its last token giving logits, then one token per llama_decode. Greedy = the highest
// logit, lowest id on ties; stops after N_NEW (32) tokens or after an end-of-generation
// token, which is kept as the last token.
//
// Only JSON parsing of the inputs uses nlohmann/json (vendored in the llama.cpp tree); the
// output lines are written here so that logits print as "%.9g" (round-trips an f32).

#include "llama.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::json;

namespace {

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "golden-driver: %s\n", msg.c_str());
    std::exit(1);
}

void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

json read_json(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        die("cannot open " + path);
    }
    try {
        return json::parse(in);
    } catch (const std::exception & e) {
        die(path + ": " + e.what());
    }
}

// A JSON string literal; throws (and so fails the run) on invalid UTF-8.
std::string jstr(const std::string & s) {
    return json(s).dump(-1, ' ', false, json::error_handler_t::strict);
}

std::string jids(const std::vector<llama_token> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        out += (i ? ", " : "") + std::to_string(ids[i]);
    }
    return out + "]";
}

std::string jfloat(float x) {
    if (!std::isfinite(x)) {
        die("non-finite logit");
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
    return buf;
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool parse_special) {
    std::vector<llama_token> ids(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), true, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) {
            die("tokenize overflow");
        }
        ids.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), true, parse_special);
        if (n < 0) {
            die("tokenize failed");
        }
    }
    ids.resize(static_cast<size_t>(n));
    return ids;
}

std::string detokenize(const llama_vocab * vocab, const std::vector<llama_token> & ids) {
    std::string text(ids.size() * 16 + 16, '\0');
    int32_t n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()), text.data(),
                                 static_cast<int32_t>(text.size()), false, true);
    if (n < 0) {
        text.resize(static_cast<size_t>(-n));
        n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()), text.data(),
                             static_cast<int32_t>(text.size()), false, true);
        if (n < 0) {
            die("detokenize failed");
        }
    }
    text.resize(static_cast<size_t>(n));
    return text;
}

void run_tokenize(const llama_vocab * vocab, const json & corpus, std::FILE * out) {
    if (!corpus.is_array()) {
        die("corpus: expected a JSON list of strings");
    }
    for (const json & item : corpus) {
        if (!item.is_string()) {
            die("corpus: expected a JSON list of strings");
        }
        const std::string text = item.get<std::string>();
        for (bool parse_special : {true, false}) {
            const std::vector<llama_token> ids = tokenize(vocab, text, parse_special);
            std::fprintf(out, "{\"text\": %s, \"parse_special\": %s, \"ids\": %s, \"detok\": %s}\n",
                         jstr(text).c_str(), parse_special ? "true" : "false", jids(ids).c_str(),
                         jstr(detokenize(vocab, ids)).c_str());
        }
    }
}

// ChatML as the model's Jinja template renders one user turn with add_generation_prompt:
// the default system turn is inserted because the first message is not a system message.
std::string render_chat(const std::string & user) {
    return "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n<|im_start|>user\n" +
           user + "<|im_end|>\n<|im_start|>assistant\n";
}

// The five best (id, logit) pairs: logit descending, id ascending on ties.
std::vector<std::pair<llama_token, float>> top5(const float * logits, int32_t n_vocab) {
    std::vector<llama_token> idx(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; i++) {
        idx[static_cast<size_t>(i)] = i;
    }
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](llama_token a, llama_token b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::vector<std::pair<llama_token, float>> best;
    for (size_t i = 0; i < 5; i++) {
        best.emplace_back(idx[i], logits[idx[i]]);
    }
    return best;
}

// llama_sampler_greedy's rule: scan ids upwards, keep the first strictly larger logit.
llama_token argmax(const float * logits, int32_t n_vocab) {
    llama_token best = 0;
    for (int32_t i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

void run_greedy(llama_model * model, const json & prompts, bool flash_attn, int n_new, std::FILE * out) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    if (!prompts.is_array()) {
        die("prompts: expected a JSON list of {\"chat\", \"text\"}");
    }
    for (const json & p : prompts) {
        if (!p.is_object() || !p.contains("chat") || !p.contains("text") || !p["chat"].is_boolean() ||
            !p["text"].is_string()) {
            die("prompts: expected a JSON list of {\"chat\", \"text\"}");
        }
        const bool chat = p["chat"].get<bool>();
        const std::string prompt = chat ? render_chat(p["text"].get<std::string>()) : p["text"].get<std::string>();
        const std::vector<llama_token> prompt_tokens = tokenize(vocab, prompt, chat);
        if (prompt_tokens.empty()) {
            die("empty prompt");
        }

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 512;
        cp.n_batch = 512;
        cp.n_ubatch = 512;
        cp.n_seq_max = 1;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.type_k = GGML_TYPE_F16;
        cp.type_v = GGML_TYPE_F16;
        cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            die("cannot create context");
        }

        std::vector<llama_token> feed = prompt_tokens;
        std::vector<llama_token> tokens;
        std::vector<std::vector<std::pair<llama_token, float>>> tops;
        while (static_cast<int>(tokens.size()) < n_new) {
            // llama_batch_get_one: sequence 0, positions continue from the cache, only the
            // last token of the batch gives logits.
            const int32_t rc = llama_decode(ctx, llama_batch_get_one(feed.data(), static_cast<int32_t>(feed.size())));
            if (rc != 0) {
                die("llama_decode returned " + std::to_string(rc));
            }
            const float * logits = llama_get_logits_ith(ctx, -1);
            if (!logits) {
                die("no logits");
            }
            const auto best = top5(logits, n_vocab);
            const llama_token next = argmax(logits, n_vocab);
            if (next != best[0].first) {
                die("argmax and top-5 disagree");
            }
            tops.push_back(best);
            tokens.push_back(next);
            if (llama_vocab_is_eog(vocab, next)) {
                break;
            }
            feed.assign(1, next);
        }
        llama_free(ctx);

        std::string t5 = "[";
        for (size_t s = 0; s < tops.size(); s++) {
            t5 += s ? ", [" : "[";
            for (size_t k = 0; k < tops[s].size(); k++) {
                t5 += (k ? ", [" : "[") + std::to_string(tops[s][k].first) + ", " + jfloat(tops[s][k].second) + "]";
            }
            t5 += "]";
        }
        t5 += "]";
        std::fprintf(out, "{\"prompt\": %s, \"chat\": %s, \"prompt_tokens\": %s, \"tokens\": %s, \"top5\": %s}\n",
                     jstr(prompt).c_str(), chat ? "true" : "false", jids(prompt_tokens).c_str(), jids(tokens).c_str(),
                     t5.c_str());
        std::fflush(out);
        std::fprintf(stderr, "greedy %s: %zu prompt tokens, %zu new\n", flash_attn ? "fa" : "nofa",
                     prompt_tokens.size(), tokens.size());
    }
}

}  // namespace

int run(int argc, char ** argv) {
    if (argc < 5) {
        die("usage: golden-driver tokenize MODEL CORPUS.json OUT.jsonl | "
            "golden-driver greedy MODEL PROMPTS.json OUT.jsonl fa|nofa [N_NEW]");
    }
    const std::string mode = argv[1];
    const std::string model_path = argv[2];
    const json input = read_json(argv[3]);
    const std::string out_path = argv[4];
    bool flash_attn = false;
    int n_new = 32;
    if (mode == "greedy") {
        if (argc < 6) {
            die("greedy needs fa|nofa");
        }
        const std::string fa = argv[5];
        if (fa != "fa" && fa != "nofa") {
            die("expected fa or nofa, got " + fa);
        }
        flash_attn = fa == "fa";
        if (argc > 6) {
            n_new = std::atoi(argv[6]);
            if (n_new < 1) {
                die("N_NEW must be positive");
            }
        }
    } else if (mode != "tokenize") {
        die("unknown mode " + mode);
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    std::fprintf(stderr, "%s\n", llama_print_system_info());
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        die("cannot load " + model_path);
    }

    std::FILE * out = std::fopen(out_path.c_str(), "wb");
    if (!out) {
        die("cannot write " + out_path);
    }
    if (mode == "tokenize") {
        run_tokenize(llama_model_get_vocab(model), input, out);
    } else {
        run_greedy(model, input, flash_attn, n_new, out);
    }
    if (std::fclose(out) != 0) {
        die("cannot write " + out_path);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception & e) {
        die(e.what());
    }
}
