/* qhx: run Qwen3 and Qwen3.5 models on the CPU. The stable C interface.
 *
 * A model (a qhx bundle or a Hugging Face checkpoint directory) is opened once and shared; any
 * number of sessions run conversations on it. A session keeps its state between calls: give it
 * the whole conversation each time (as token ids, or as chat messages) and it processes only what
 * it has not seen, going back to a turn boundary when an earlier message changed.
 *
 * Threads: a model may be used from several threads at once. A session is used by one thread at
 * a time, except qhx_session_cancel, which any thread may call. Sessions on different threads
 * take turns on the CPU one forward pass at a time.
 *
 * Errors: every function that can fail returns a qhx_status; on failure, qhx_last_error() gives
 * a one-line message naming the file or field at fault (per thread, until the next failing call).
 *
 * Structs of options are filled with their *_default function first, then changed field by
 * field: later versions only append fields.
 */
#ifndef QHX_QHX_H
#define QHX_QHX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QHX_API_VERSION                                                       \
  5 /* 2: qhx_model_options.qnn_lib and npu_pack,                             \
        qhx_generate_result.device_tokens appended; 3: embeddings (qhx_embed, \
        qhx_model_info.embedding_size and pooling, QHX_ERROR_CANCELLED);      \
        4: images (qhx_image_tokens, qhx_image_tokens_from_file);             \
        5: image parts in chat requests, qhx_chat_tokens */

typedef enum qhx_status {
  QHX_OK = 0,
  QHX_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, out-of-range option, malformed request JSON */
  QHX_ERROR_MODEL = 2,            /* model files missing, malformed, wrong checksum, unsupported */
  QHX_ERROR_TEMPLATE = 3,         /* the chat template failed (message has the template line) */
  QHX_ERROR_CONTEXT_FULL = 4,     /* prompt + max_new_tokens exceed the context length */
  QHX_ERROR_OUT_OF_MEMORY = 5,    /* memory admission refused (message has the estimate) */
  QHX_ERROR_STATE_FILE = 6, /* a state file could not be written, read, or belongs elsewhere */
  QHX_ERROR_BUFFER_TOO_SMALL = 7, /* the output did not fit; the needed size was stored */
  QHX_ERROR_INTERNAL = 8,         /* a bug: please report the message */
  QHX_ERROR_CANCELLED = 9         /* qhx_session_cancel stopped a call that has no partial result */
} qhx_status;

const char* qhx_version(void);
/* The message of the last failed call on this thread ("" if none). */
const char* qhx_last_error(void);
/* Frees strings that qhx allocated (rendered templates, generated text). NULL is allowed. */
void qhx_string_free(char* text);

/* ---------------------------------------------------------------------------------------------
 * Models
 */
typedef struct qhx_model qhx_model;

typedef struct qhx_model_options {
  int32_t n_threads;      /* compute threads of the model's own pool; 0: every hardware thread
                             the process may use (its CPU affinity) */
  int64_t context_length; /* tokens per session; 0: as long as the model allows and memory holds */
  int32_t max_sessions;   /* sessions live at once, counted by memory admission; default 1 */
  int64_t prefix_cache_bytes; /* bound of the prefix cache shared by sessions; 0: none */
  int32_t verify_sha256;      /* bundles: check every file's sha256 at open (slow for big models) */
  int32_t check_memory;       /* 1 (default): refuse or shorten the context to fit in memory */
  const char* device;         /* where prompts run: "cpu" (default; NULL too), "vulkan" or
                                 "vulkan:N", "hexagon" or "hexagon:v73|v75|v79|v81" (the NPU;
                                 Qualcomm's simulator on x86) (`qhx devices` lists them) */
  const char* decode_device;  /* where replies are decoded: NULL for the device's default (the
                                 GPU itself when it is a discrete one, else the CPU), "cpu", the
                                 same device as `device` (a GPU, or the NPU: "hexagon"), or after
                                 an NPU `device`, "vulkan" or "vulkan:N" */
  const char* device_check;   /* before a device is used: "once" (default; NULL too) compares it
                                 with the CPU on probe prompts unless it passed before (cached
                                 under $QHX_CACHE_DIR or ~/.cache/qhx), "always", or "never" */
  const char* draft_model;    /* NULL, or a smaller checkpoint or bundle with the same tokenizer,
                                 opened beside the model (on the CPU, with its threads) for
                                 speculative "draft" */
  int64_t mtp_vocab_size;     /* speculative "mtp": the head drafts from the first N tokens of the
                                 model's draft_vocab.json; 0 (default): all of them; -1: from the
                                 whole vocabulary. Without the file it always uses the whole one */
  const char* qnn_lib;        /* "hexagon": the folder of Qualcomm's libQnnHtp.so and
                                 libQnnSystem.so; NULL: $QHX_QNN_LIB, else beside qhx, else an
                                 installed onnxruntime_qnn Python package */
  const char* npu_pack;       /* "hexagon": an NPU pack of this model's bundle (qhx forge npu):
                                 its graphs for the chip load instead of compiling on first use;
                                 a pack for another bundle, a chip it lacks or a changed file is
                                 an error */
  const char* kv_type;        /* how the KV caches hold keys and values: "f32" (default; NULL
                                 too), "f16", "q8" (int8 with a scale per head and position:
                                 ~3.9x smaller than f32) or "q4" (4-bit, a scale per 32: ~6.4x);
                                 their attention runs on the CPU */
} qhx_model_options;

void qhx_model_options_default(qhx_model_options* options);
/* Opens a bundle, a pack of bundles, or a Hugging Face checkpoint directory. */
qhx_status qhx_model_open(const char* path, const qhx_model_options* options, qhx_model** model);
/* Closes the model; its sessions must have been destroyed. NULL is allowed. */
void qhx_model_close(qhx_model* model);

typedef struct qhx_model_info {
  const char* name;   /* the model directory's name */
  const char* family; /* "qwen3" or "qwen3_5" */
  int64_t vocab_size;
  int64_t context_length;     /* after memory admission */
  int64_t memory_estimate;    /* bytes memory admission planned for (0 if it did not run) */
  const char* admission_note; /* why the context was shortened, or "" */
  const int32_t* eos_ids;     /* generation stops on these by default */
  size_t n_eos_ids;
  int32_t has_chat_template;
  int32_t n_threads; /* compute threads the model was opened with (0 in the options: every one) */
  const char* prefill_device; /* where prompts run now: "cpu", "vulkan:0", ... */
  const char* decode_device;  /* where replies are decoded now */
  const char* device_note;    /* why a device asked for is not used, or how decoding was
                                 placed; "" if nothing to say */
  const char* model_note;     /* what of the checkpoint is left unused and why (an incomplete
                                 MTP head: the model runs as a text model), or "" */
  int64_t embedding_size;     /* floats in a vector of qhx_embed (the hidden size) */
  const char* pooling;        /* an embedding checkpoint's pooling (its sentence-transformers
                                 files: "last", "mean" or "cls"), or "" for a generative one */
  int32_t reads_images;       /* 1: qhx_image_tokens works (a vision tower); else 0 */
  const char* vision_note;    /* why the model reads no images, or "" */
} qhx_model_info;

/* The pointers stay valid while the model is open. */
qhx_status qhx_model_get_info(const qhx_model* model, qhx_model_info* info);

/* ---------------------------------------------------------------------------------------------
 * Text
 */

/* UTF-8 text to token ids (added tokens such as <|im_start|> in the text become their ids; no BOS
 * is added). Invalid UTF-8 is QHX_ERROR_INVALID_ARGUMENT. If `capacity` is too small, nothing is
 * written, *n_ids is the count needed and the status is QHX_ERROR_BUFFER_TOO_SMALL. */
qhx_status qhx_tokenize(const qhx_model* model, const char* text, size_t text_len, int32_t* ids,
                        size_t capacity, size_t* n_ids);
/* Token ids to UTF-8 text (invalid sequences become U+FFFD). The text is NUL-terminated when
 * there is room; *text_len excludes the NUL. Too small a buffer works as for qhx_tokenize. An id
 * outside [0, vocab_size) is QHX_ERROR_INVALID_ARGUMENT; ids the model has but the tokenizer
 * has no token for (padding rows) decode to nothing. */
qhx_status qhx_detokenize(const qhx_model* model, const int32_t* ids, size_t n_ids,
                          int32_t skip_special, char* text, size_t capacity, size_t* text_len);

/* Images (Qwen3.5 checkpoints with their vision tower, docs/vision.md): a PNG or JPEG file's
 * bytes (`name` names it in errors) decoded, preprocessed as transformers' image processor does
 * and encoded by the tower, as the ids that stand for the image's tokens: put them in a prompt in
 * place of its <|image_pad|> (between <|vision_start|> and <|vision_end|>), and generate as with
 * any ids. The same image gives the same ids (it is encoded once while the model keeps it), so a
 * conversation that keeps an image reuses its state. A bad image is QHX_ERROR_INVALID_ARGUMENT
 * naming it; a model without a tower is QHX_ERROR_MODEL. Too small a buffer works as for
 * qhx_tokenize (the image is encoded once either way). */
qhx_status qhx_image_tokens(const qhx_model* model, const void* bytes, size_t n_bytes,
                            const char* name, int32_t* ids, size_t capacity, size_t* n_ids);
qhx_status qhx_image_tokens_from_file(const qhx_model* model, const char* path, int32_t* ids,
                                      size_t capacity, size_t* n_ids);

/* One token's bytes as the tokenizer holds them (a piece of UTF-8 that may end inside a
 * character; a special token's text), not NUL-terminated; a buffer too small works as for
 * qhx_tokenize; an id without a token (a padding row) has none. */
qhx_status qhx_token_bytes(const qhx_model* model, int32_t id, char* bytes, size_t capacity,
                           size_t* n_bytes);

/* The request's "chat_template_kwargs" apply first; an option set away from its default wins. */
typedef struct qhx_template_options {
  int32_t add_generation_prompt; /* default 1; 0: no generation prompt */
  int32_t enable_thinking;       /* -1 (default): as the request says (not passed if it does not);
                                    0: false; 1: true */
} qhx_template_options;

void qhx_template_options_default(qhx_template_options* options);
/* Renders the checkpoint's chat template exactly as transformers' apply_chat_template does.
 * request_json: {"messages": [...], "tools": [...], "chat_template_kwargs": {...}} (tools and
 * kwargs optional), OpenAI-style messages; the kwargs are apply_chat_template's keyword
 * arguments (add_generation_prompt, enable_thinking, or any template variable).
 * *text is allocated; free it with qhx_string_free. */
qhx_status qhx_apply_chat_template(const qhx_model* model, const char* request_json,
                                   const qhx_template_options* options, char** text);

/* The ids the model reads for a conversation: request_json rendered (as qhx_apply_chat_template)
 * and tokenized, with each image part's ids (as qhx_image_tokens gives them) in place of the
 * <|image_pad|> the template wrote for it. An image part is {"type": "image", "image": SOURCE}
 * ("path" or "url" for "image" also do; transformers' names) or OpenAI's {"type": "image_url",
 * "image_url": {"url": SOURCE}}, SOURCE a file's path or a base64 data: URL (qhx fetches
 * nothing). An image part for a model without a tower is QHX_ERROR_MODEL; a bad image
 * QHX_ERROR_INVALID_ARGUMENT naming the part. Too small a buffer works as for qhx_tokenize. */
qhx_status qhx_chat_tokens(const qhx_model* model, const char* request_json,
                           const qhx_template_options* options, int32_t* ids, size_t capacity,
                           size_t* n_ids);

/* ---------------------------------------------------------------------------------------------
 * Generation
 */
typedef struct qhx_sampling {
  int32_t greedy; /* 1: always the most likely token (after penalties and bias) */
  float temperature;
  int32_t top_k;                 /* 0: off */
  float top_p;                   /* 1: off */
  float min_p;                   /* 0: off */
  float repetition_penalty;      /* 1: off; over the prompt and the generated tokens */
  float presence_penalty;        /* 0: off; over the generated tokens */
  float frequency_penalty;       /* 0: off; over the generated tokens */
  uint64_t seed;                 /* same seed, same options, same model: same tokens */
  const int32_t* logit_bias_ids; /* added to those tokens' logits */
  const float* logit_bias_values;
  size_t n_logit_bias;
} qhx_sampling;

typedef struct qhx_generate_options {
  int64_t max_new_tokens;  /* default 256 */
  qhx_sampling sampling;   /* default: the model's generation_config.json */
  int32_t stop_at_eos;     /* 1 (default): stop on the model's eos ids */
  const int32_t* stop_ids; /* more ids to stop on (the stop id is reported, then generation ends) */
  size_t n_stop_ids;
  const char* const* stop_strings; /* stop when the text contains one; it is not reported */
  size_t n_stop_strings;
  /* Speculative decoding: NULL or "none" (default), "ngram" (prompt lookup: drafts from what
   * followed earlier occurrences of the text's last tokens), "mtp" (the model's own
   * multi-token-prediction head, Qwen3.5 checkpoints with mtp.* weights) or "draft" (the model
   * options' draft_model decodes greedily ahead), verified draft_max + 1 tokens per forward pass.
   * Greedy output is the same as without; sampled output follows the same distribution (speculative
   * sampling keeps each draft token with the probability the model gives it). */
  const char* speculative;
  int32_t draft_max; /* tokens per draft, 1..32; 0: 4 */
  /* Structured output (docs/structured_output.md): NULL (default), or OpenAI's response_format
   * as JSON text: {"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
   * "json_schema": {"name": .., "schema": {..}, "strict": true}}, and qhx's own
   * {"type": "grammar", "grammar": "<GBNF>", "syntax": "gbnf" | "lark"}, {"type": "regex",
   * "pattern": ".."}, {"type": "tool_calls", "tools": [OpenAI tools], "parallel": false} (a call
   * of one of the tools, its arguments to the tool's parameter schema) and {"type":
   * "structural_tag", "format": {..}} (xgrammar's). Every token is then one the format allows,
   * and the reply ends (QHX_STOP_EOS) when the format is complete. A chat call's <think> block
   * comes first, free. Speculative decoding is off for such a reply. */
  const char* response_format;
  /* Log-probabilities (docs/server.md): with logprobs = 1, each generated token's log-softmax
   * under the model's logits at its step (before temperature, penalties and filters), and the
   * top_logprobs (0..20) most likely tokens at that step, are what qhx_session_token_logprobs
   * returns during that token's callback. Speculative decoding is off for such a reply. */
  int32_t logprobs;
  int32_t top_logprobs;
} qhx_generate_options;

/* Defaults from the model's generation_config.json (greedy if it has none). */
qhx_status qhx_generate_options_default(const qhx_model* model, qhx_generate_options* options);

/* QHX_OK if generation on `model` would accept `options`, else QHX_ERROR_INVALID_ARGUMENT naming
 * the first field it refuses (the same checks the generate calls make before any work). */
qhx_status qhx_generate_options_check(const qhx_model* model, const qhx_generate_options* options);

/* Called for every generated token with the text it completes: UTF-8, possibly empty while a
 * multi-byte character or a possible stop string is held back (an eos or stop id adds no text).
 * Text still held when generation ends comes in one last call with token -1. Return 0 to go on,
 * anything else to stop. `text` is valid during the call only. */
typedef int (*qhx_token_callback)(void* user_data, int32_t token, const char* text,
                                  size_t text_len);

typedef enum qhx_stop_reason {
  QHX_STOP_LENGTH = 0,   /* max_new_tokens reached */
  QHX_STOP_EOS = 1,      /* an eos or stop id */
  QHX_STOP_STRING = 2,   /* a stop string */
  QHX_STOP_CALLBACK = 3, /* the callback returned nonzero */
  QHX_STOP_CANCELLED = 4 /* qhx_session_cancel */
} qhx_stop_reason;

typedef struct qhx_generate_result {
  qhx_stop_reason stop_reason;
  int64_t n_prompt;    /* tokens in the conversation given */
  int64_t n_reused;    /* of those, already in the session's state (or the prefix cache) */
  int64_t n_processed; /* of those, run through the model by this call */
  int64_t n_generated;
  double prefill_ms;
  double ttft_ms; /* call to first token */
  double decode_ms;
  char* text; /* everything generated (stop string excluded); free with qhx_string_free */
  int64_t device_failures; /* device failures this call went through: the CPU redid that work
                              (no token lost or repeated) and runs the model from then on */
  int64_t verify_passes;   /* speculative decoding: passes that verified a draft, */
  int64_t drafted;         /* the draft tokens they verified, */
  int64_t accepted;        /* and those the model agreed with (each a token without a pass) */
  int64_t device_tokens;   /* prompt tokens whose pass ran on a device during this call (an
                              NPU's: whole prompt chunks; the rest ran on the CPU or a GPU);
                              counted per model, so other sessions' passes during the prompt
                              count too */
  double constraint_ms;    /* response_format: time in its constraint (the masks of the tokens
                              allowed, each token accepted), part of prefill_ms + decode_ms */
} qhx_generate_result;

/* ---------------------------------------------------------------------------------------------
 * Sessions
 */
typedef struct qhx_session qhx_session;

typedef struct qhx_session_options {
  int64_t context_length;  /* 0: the model's (after admission) */
  int64_t prefill_chunk;   /* tokens per forward pass in prefill; default 512 */
  int32_t max_checkpoints; /* turn-boundary checkpoints kept; default 8 */
} qhx_session_options;

void qhx_session_options_default(qhx_session_options* options);
qhx_status qhx_session_create(qhx_model* model, const qhx_session_options* options,
                              qhx_session** session);
void qhx_session_destroy(qhx_session* session); /* NULL is allowed */

/* Continues the conversation `tokens` (all of it so far). The result may be NULL. */
qhx_status qhx_session_generate(qhx_session* session, const int32_t* tokens, size_t n_tokens,
                                const qhx_generate_options* options, qhx_token_callback callback,
                                void* user_data, qhx_generate_result* result);
/* Continues a chat the caller rendered and tokenized itself: as qhx_session_generate, and like
 * qhx_session_chat it keeps the state at the start of the last turn's header (<|im_start|>), where
 * the next turn's rendering of this reply begins to differ (templates drop reasoning). */
qhx_status qhx_session_chat_tokens(qhx_session* session, const int32_t* tokens, size_t n_tokens,
                                   const qhx_generate_options* options, qhx_token_callback callback,
                                   void* user_data, qhx_generate_result* result);
/* Continues the conversation request_json holds, read as qhx_chat_tokens reads it (images
 * included). */
qhx_status qhx_session_chat(qhx_session* session, const char* request_json,
                            const qhx_template_options* template_options,
                            const qhx_generate_options* options, qhx_token_callback callback,
                            void* user_data, qhx_generate_result* result);
/* Stops the generation running now at the next token or prefill chunk (result: cancelled). A
 * call when none is running does nothing: every generation starts uncancelled, so a late cancel
 * never stops the next request. Any thread may call it. */
void qhx_session_cancel(qhx_session* session);

/* With qhx_generate_options.logprobs: the log-probabilities of the token the callback is being
 * called for (token ids >= 0), valid until the callback returns. `top_tokens`/`top_logprobs`
 * hold n_top entries, most likely first. A logit of -inf gives -INFINITY. Outside such a
 * callback, or without logprobs, QHX_ERROR_INVALID_ARGUMENT. */
typedef struct qhx_token_logprobs {
  int32_t token;
  float logprob;
  int32_t n_top;
  const int32_t* top_tokens;
  const float* top_logprobs;
} qhx_token_logprobs;
qhx_status qhx_session_token_logprobs(const qhx_session* session, qhx_token_logprobs* out);

/* ---------------------------------------------------------------------------------------------
 * Embeddings (docs/embeddings.md): sentence vectors as sentence-transformers computes them from
 * an embedding checkpoint (Qwen3-Embedding: the last token's final-norm row, L2-normalised; its
 * modules.json, 1_Pooling/config.json and config_sentence_transformers.json say so), or from any
 * model with the pooling given. Inputs run one after another on a session's state, in its
 * prefill chunks, without logits; the conversation the session held is dropped.
 */
typedef struct qhx_embed_options {
  const char* pooling;     /* NULL (default): the model's; "last", "mean" or "cls" */
  int32_t normalize;       /* -1 (default): the model's (a Normalize module; L2 for a model
                              without sentence-transformers files); 0: no; 1: L2 */
  int64_t dimensions;      /* 0 (default): embedding_size; 1..embedding_size: the first N (as
                              Matryoshka-trained models allow), normalized after the cut */
  const char* prompt;      /* qhx_embed: text put before every input (Qwen3-Embedding's queries
                              take "Instruct: <task>\nQuery:"); NULL: prompt_name's */
  const char* prompt_name; /* qhx_embed: one of the model's prompts (Qwen3-Embedding: "query",
                              "document"); NULL: its default_prompt_name, else none */
} qhx_embed_options;

typedef struct qhx_embed_result {
  int64_t dimensions; /* floats per vector */
  int64_t n_tokens;   /* tokens run, of every input (prompts and special tokens included) */
  double ms;
  int64_t n_truncated; /* qhx_embed: texts cut to the model's max_seq_length (its
                          sentence_bert_config.json), as sentence-transformers cuts them */
} qhx_embed_result;

void qhx_embed_options_default(qhx_embed_options* options);
/* One vector per text, each text tokenized as Hugging Face's tokenizer(prompt + text) does (with
 * the special tokens its post-processor adds: Qwen3-Embedding appends <|endoftext|>; cut to the
 * model's max_seq_length as sentence-transformers cuts it, the special tokens kept); text_lens
 * NULL: the texts are NUL-terminated. `embeddings` receives n_texts vectors of
 * result->dimensions floats, one after the other. `capacity` (floats) too small: nothing runs,
 * QHX_ERROR_BUFFER_TOO_SMALL, result->dimensions says the size. An input longer than the
 * session's context is QHX_ERROR_CONTEXT_FULL (before any input runs); qhx_session_cancel:
 * QHX_ERROR_CANCELLED. The result may be NULL. */
qhx_status qhx_embed(qhx_session* session, const char* const* texts, const size_t* text_lens,
                     size_t n_texts, const qhx_embed_options* options, float* embeddings,
                     size_t capacity, qhx_embed_result* result);
/* As qhx_embed over token ids taken as they are (no prompt, no special tokens): input i is
 * ids[offsets[i] .. offsets[i + 1]), offsets has n_inputs + 1 entries. */
qhx_status qhx_embed_tokens(qhx_session* session, const int32_t* ids, const size_t* offsets,
                            size_t n_inputs, const qhx_embed_options* options, float* embeddings,
                            size_t capacity, qhx_embed_result* result);

/* Tokens of `tokens` the session could reuse without processing them. */
int64_t qhx_session_reusable(const qhx_session* session, const int32_t* tokens, size_t n_tokens);
/* The tokens the session's state holds; valid until the next call on the session. */
qhx_status qhx_session_tokens(const qhx_session* session, const int32_t** tokens, size_t* n_tokens);
qhx_status qhx_session_reset(qhx_session* session);
/* The state and its tokens to a file, and back (refused for a file from another model). */
qhx_status qhx_session_save(const qhx_session* session, const char* path);
qhx_status qhx_session_load(qhx_session* session, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* QHX_QHX_H */
