/* A two-turn chat through qhx's C API: open a model, chat with its own chat template while the
 * reply streams, then check that the second turn reused the first instead of reprocessing it,
 * and that a saved session continues exactly like the original.
 *
 *   build/examples/qhx_example_chat [model_dir]      (default: models/qwen3.5-kjv)
 */
#include <qhx/qhx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_piece(void* user_data, int32_t token, const char* text, size_t len) {
  (void)user_data;
  (void)token;
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  return 0;
}

static int fail(const char* what) {
  fprintf(stderr, "%s: %s\n", what, qhx_last_error());
  return 1;
}

/* Appends `text` to `out` as a JSON string literal. */
static void append_json_string(char* out, size_t capacity, const char* text) {
  size_t n = strlen(out);
  const size_t room = capacity - 8; /* the longest escape plus the closing quote and NUL */
  out[n++] = '"';
  for (const unsigned char* c = (const unsigned char*)text; *c != '\0' && n < room; ++c) {
    if (*c == '"' || *c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)*c;
    } else if (*c < 0x20) {
      n += (size_t)snprintf(out + n, capacity - n, "\\u%04x", *c);
    } else {
      out[n++] = (char)*c;
    }
  }
  out[n++] = '"';
  out[n] = '\0';
}

int main(int argc, char** argv) {
  const char* model_dir = argc > 1 ? argv[1] : "models/qwen3.5-kjv";
  qhx_model_options model_options;
  qhx_model_options_default(&model_options);
  model_options.context_length = 4096;
  qhx_model* model = NULL;
  if (qhx_model_open(model_dir, &model_options, &model) != QHX_OK) return fail("open");
  qhx_session* session = NULL;
  if (qhx_session_create(model, NULL, &session) != QHX_OK) return fail("session");

  qhx_generate_options options;
  qhx_generate_options_default(model, &options);
  options.sampling.greedy = 1;
  options.max_new_tokens = 24;

  /* The conversation as a JSON array being built, and each request made from it. */
  static char messages[16384], request[16400];
  const char* question = "And it came to pass";
  strcpy(messages, "[{\"role\": \"user\", \"content\": ");
  append_json_string(messages, sizeof messages, question);
  snprintf(request, sizeof request, "{\"messages\": %s}]}", messages);
  printf("user: %s\nassistant: ", question);
  qhx_generate_result first;
  if (qhx_session_chat(session, request, NULL, &options, print_piece, NULL, &first) != QHX_OK) {
    return fail("turn 1");
  }
  printf("\n[turn 1: %lld prompt tokens processed, %lld generated]\n",
         (long long)first.n_processed, (long long)first.n_generated);
  if (qhx_session_save(session, "qhx_example_chat.state") != QHX_OK) return fail("save");

  const char* follow_up = "What happened next?";
  strcat(messages, "}, {\"role\": \"assistant\", \"content\": ");
  append_json_string(messages, sizeof messages, first.text);
  strcat(messages, "}, {\"role\": \"user\", \"content\": ");
  append_json_string(messages, sizeof messages, follow_up);
  snprintf(request, sizeof request, "{\"messages\": %s}]}", messages);
  printf("user: %s\nassistant: ", follow_up);
  qhx_generate_result second;
  if (qhx_session_chat(session, request, NULL, &options, print_piece, NULL, &second) != QHX_OK) {
    return fail("turn 2");
  }
  printf("\n[turn 2: %lld of %lld prompt tokens reused, %lld processed]\n",
         (long long)second.n_reused, (long long)second.n_prompt, (long long)second.n_processed);

  /* The saved state continues exactly as the live session did. */
  qhx_session* restored = NULL;
  qhx_generate_result again;
  if (qhx_session_create(model, NULL, &restored) != QHX_OK) return fail("session");
  if (qhx_session_load(restored, "qhx_example_chat.state") != QHX_OK) return fail("load");
  if (qhx_session_chat(restored, request, NULL, &options, NULL, NULL, &again) != QHX_OK) {
    return fail("restored turn 2");
  }
  remove("qhx_example_chat.state");
  const int reused = second.n_reused >= first.n_prompt;
  const int same = strcmp(second.text, again.text) == 0;
  printf("[restored session: %s]\n", same ? "same reply" : "DIFFERENT reply");

  qhx_string_free(first.text);
  qhx_string_free(second.text);
  qhx_string_free(again.text);
  qhx_session_destroy(restored);
  qhx_session_destroy(session);
  qhx_model_close(model);
  if (!reused) fprintf(stderr, "turn 2 did not reuse turn 1's state\n");
  return reused && same ? 0 : 1;
}
