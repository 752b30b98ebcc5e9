/* Memory admission against the real thing: opens a model through the C API with a context of N
 * tokens, fills that context (N - 16 prompt tokens, then 16 generated greedily), and prints the
 * admission estimate next to the process's peak resident memory.
 *
 *   build/bench/memory_check MODEL CONTEXT [THREADS]
 *
 * The prompt is token ids cycling through the vocabulary (no tokenizer needed). The estimate
 * counts the mapped weights as resident, so the model's files are read in full first. */
#include <qhx/qhx.h>
#include <sys/resource.h>
#include <cstdio>
#include <cstdlib>

static int ignore(void* user, int32_t token, const char* text, size_t len) {
  (void)user;
  (void)token;
  (void)text;
  (void)len;
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL CONTEXT [THREADS]\n", argv[0]);
    return 2;
  }
  const int64_t context = atoll(argv[2]);
  qhx_model_options options;
  qhx_model_options_default(&options);
  options.context_length = context;
  options.n_threads = argc > 3 ? atoi(argv[3]) : 0;
  qhx_model* model = nullptr;
  if (qhx_model_open(argv[1], &options, &model) != QHX_OK) {
    fprintf(stderr, "%s\n", qhx_last_error());
    return 1;
  }
  qhx_model_info info;
  qhx_model_get_info(model, &info);
  qhx_session* session = nullptr;
  if (qhx_session_create(model, nullptr, &session) != QHX_OK) {
    fprintf(stderr, "%s\n", qhx_last_error());
    return 1;
  }
  const int64_t n_new = 16, n_prompt = context - n_new;
  int32_t* prompt = static_cast<int32_t*>(malloc(sizeof(int32_t) * (size_t)n_prompt));
  for (int64_t i = 0; i < n_prompt; ++i) prompt[i] = (int32_t)((i * 7919 + 13) % info.vocab_size);
  qhx_generate_options generate;
  qhx_generate_options_default(model, &generate);
  generate.sampling.greedy = 1;
  generate.max_new_tokens = n_new;
  generate.stop_at_eos = 0; /* fill the context whatever the model predicts */
  qhx_generate_result result;
  if (qhx_session_generate(session, prompt, (size_t)n_prompt, &generate, ignore, nullptr,
                           &result) != QHX_OK) {
    fprintf(stderr, "%s\n", qhx_last_error());
    return 1;
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double peak = (double)usage.ru_maxrss * 1024.0;
  printf(
      "%s: context %lld (%lld prompt + %lld generated), %d threads: estimate %.1f MB, "
      "peak RSS %.1f MB, estimate / peak %.3f\n",
      info.name, (long long)context, (long long)n_prompt, (long long)result.n_generated,
      info.n_threads, info.memory_estimate / 1e6, peak / 1e6, info.memory_estimate / peak);
  qhx_string_free(result.text);
  free(prompt);
  qhx_session_destroy(session);
  qhx_model_close(model);
  return 0;
}
