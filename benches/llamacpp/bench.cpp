// Batch-1 prefill and greedy decode of a GGUF model on llama.cpp's CUDA backend: the shape of
// `llm-worker bench --prompt-len P --gen G --concurrency 1`, written against llama.h only.
// Prints one JSON line per timed repetition (the first, untimed, warms the kernels up).
// usage: llamacpp-bench MODEL.gguf [PROMPT_LEN=512] [GEN=256] [REPS=3]
#include "llama.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Greedy pick over the row of logits llama.cpp copied back for output `i`.
static llama_token argmax(llama_context * ctx, int32_t i, int n_vocab) {
    const float * l = llama_get_logits_ith(ctx, i);
    int best = 0;
    for (int j = 1; j < n_vocab; j++) {
        if (l[j] > l[best]) best = j;
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT_LEN] [GEN] [REPS]\n", argv[0]);
        return 2;
    }
    const int prompt = argc > 2 ? atoi(argv[2]) : 512;
    const int gen = argc > 3 ? atoi(argv[3]) : 256;
    const int reps = argc > 4 ? atoi(argv[4]) : 3;
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999; // every layer on the GPU
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = prompt + gen + 16;
    cp.n_batch = prompt;
    cp.n_ubatch = prompt;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    // A pseudo-random prompt (random weights: the text does not matter, its length does).
    std::vector<llama_token> tokens(prompt);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (auto & t : tokens) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t = (llama_token) ((s >> 33) % (uint64_t) n_vocab);
    }
    llama_batch batch = llama_batch_init(prompt, 0, 1);
    for (int rep = 0; rep <= reps; rep++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = prompt;
        for (int i = 0; i < prompt; i++) {
            batch.token[i] = tokens[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i == prompt - 1;
        }
        const double t0 = now_s();
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "prefill failed\n");
            return 1;
        }
        llama_token next = argmax(ctx, prompt - 1, n_vocab);
        const double t1 = now_s();
        for (int g = 0; g < gen; g++) {
            batch.n_tokens = 1;
            batch.token[0] = next;
            batch.pos[0] = prompt + g;
            batch.n_seq_id[0] = 1;
            batch.seq_id[0][0] = 0;
            batch.logits[0] = 1;
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "decode step %d failed\n", g);
                return 1;
            }
            next = argmax(ctx, 0, n_vocab);
        }
        const double t2 = now_s();
        if (rep > 0) {
            printf("{\"concurrency\": 1, \"prompt_len\": %d, \"gen\": %d, \"rep\": %d, \"ttft_ms\": %.3f, \"decode_tok_s\": %.2f}\n",
                   prompt, gen, rep, (t1 - t0) * 1e3, gen / (t2 - t1));
            fflush(stdout);
        }
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
