// qhx command line: generate, embed, tokenize, render chat templates, score (perplexity),
// forge/verify/pack bundles, serve.
// main() only wires the subcommands' options to the commands (commands.h, chat.h).
#include <CLI/CLI.hpp>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "chat.h"
#include "commands.h"
#include "core/kv_layout.h"
#include "forge/synth.h"
#include "util/error.h"

namespace {

// A whole number in base 10 from `low` to `high`, passed on as its plain decimal (CLI11 would
// read "010" as octal and "0x10" as hex, and saturate past the type). Its errors name the
// bound (CLI11's NonNegativeNumber and PositiveNumber named the largest double, 309 digits).
CLI::Validator whole_number(int64_t low, uint64_t high) {
  const std::string low_text = std::to_string(low), high_text = std::to_string(high);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const bool negative = text.starts_with('-');
        const char* const first = text.data() + (negative ? 1 : 0);
        const char* const last = text.data() + text.size();
        uint64_t magnitude = 0;
        const auto [end, error] = std::from_chars(first, last, magnitude);
        if (first == last || end != last ||
            (error != std::errc() && error != std::errc::result_out_of_range)) {
          return "'" + text + "' is not a whole number";
        }
        const bool over = error == std::errc::result_out_of_range;
        if (negative) {
          // -magnitude >= low, for low < 0 (magnitude up to 2^63 fits the test below).
          if (low >= 0 ? magnitude > 0
                       : over || magnitude > static_cast<uint64_t>(-(low + 1)) + 1) {
            return "must be >= " + low_text + ", got " + text;
          }
          text = magnitude == 0 ? "0" : "-" + std::to_string(magnitude);
          return "";
        }
        if (over || magnitude > high)
          return "'" + text + "' is too large (at most " + high_text + ")";
        if (low > 0 && magnitude < static_cast<uint64_t>(low)) {
          return "must be >= " + low_text + ", got " + text;
        }
        text = std::to_string(magnitude);
        return "";
      },
      "INTEGER in [" + low_text + ", " + high_text + "]");
}
const CLI::Validator kNonNegative = whole_number(0, INT64_MAX);
const CLI::Validator kPositive = whole_number(1, INT64_MAX);
const CLI::Validator kSeed = whole_number(0, UINT64_MAX);

// An option that refuses an empty value: the empty string would silently mean "off".
CLI::Validator not_empty(const std::string& why) {
  return CLI::Validator(
      [=](const std::string& text) -> std::string { return text.empty() ? why : ""; }, "TEXT");
}

void add_threads_option(CLI::App* command, int& threads) {
  command->add_option("-t,--threads", threads, "Compute threads (default: all hardware threads)")
      ->transform(whole_number(1, 256));
}

void add_device_options(CLI::App* command, qhx::cli::DeviceArgs& devices) {
  command->add_option("--device", devices.device,
                      "Where prompts run: cpu, vulkan or vulkan:N, hexagon or hexagon:vNN (the "
                      "NPU; `qhx devices` lists them)");
  command->add_option("--decode-device", devices.decode_device,
                      "Where replies are decoded: cpu, the --device GPU or NPU, or (after "
                      "--device hexagon) vulkan (default: a discrete GPU itself, else the "
                      "CPU)");
  command->add_option("--npu-pack", devices.npu_pack,
                      "hexagon: the model's NPU pack (qhx forge npu): graphs load rather than "
                      "compile on first use");
  command->add_option("--qnn-lib", devices.qnn_lib,
                      "hexagon: the folder of Qualcomm's libQnnHtp.so and libQnnSystem.so "
                      "(default: $QHX_QNN_LIB, beside qhx, an installed onnxruntime_qnn)");
  command
      ->add_option("--device-check", devices.device_check,
                   "Compare the device with the CPU before using it: once (default: unless it "
                   "passed before), always, never")
      ->check(CLI::IsMember({"once", "always", "never"}));
  command
      ->add_option("--kv-type", devices.kv_type,
                   "How the KV cache holds keys and values: f32 (default, exact), f16, q8 (int8, a "
                   "scale per head: ~3.9x smaller) or q4 (4-bit, a scale per 32: ~6.4x); "
                   "quantized caches are attended on the CPU")
      ->check(
          [](const std::string& value) -> std::string {
            try {
              qhx::parse_kv_type(value, "--kv-type");
              return "";
            } catch (const qhx::Error& e) {  // CLI11 names the option itself
              const std::string message = e.what();
              return message.substr(message.find(": ") + 2);
            }
          },
          "f32|f16|q8|q4");
}

void add_speculative_options(CLI::App* command, qhx::cli::SpeculativeArgs& speculative,
                             const std::string& help) {
  command->add_option("--speculative", speculative.value, help)
      ->check(
          [](const std::string& value) -> std::string {
            if (value == "none" || value == "ngram" || value == "mtp") return "";
            if (value.rfind("draft:", 0) == 0 && value.size() > 6) return "";
            return "'" + value + "' is not none, ngram, mtp or draft:<dir>";
          },
          "none|ngram|mtp|draft:DIR");
  command->add_option("--draft-max", speculative.draft_max, "Tokens per speculative draft")
      ->transform(whole_number(1, 32));
  command
      ->add_option("--draft-vocab", speculative.mtp_vocab,
                   "mtp: draft from the first N tokens of the model's draft_vocab.json (0: all "
                   "of them, -1: from the whole vocabulary)")
      ->transform(whole_number(-1, uint64_t{1} << 31));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qhx: on-device runtime for Qwen3 and Qwen3.5 models"};
  app.require_subcommand(1);

  qhx::cli::GenerateArgs gen;
  CLI::App* generate = app.add_subcommand("generate", "Generate a continuation of a prompt");
  generate
      ->add_option("--model,-m", gen.model, "Bundle, pack, or Hugging Face checkpoint directory")
      ->required();
  auto* prompt_opt = generate->add_option("--prompt,-p", gen.prompt, "Prompt text (UTF-8)");
  auto* ids_opt =
      generate->add_option("--prompt-ids", gen.prompt_ids, "Prompt as comma-separated token ids");
  prompt_opt->excludes(ids_opt);
  generate->add_option(
      "--image", gen.images,
      "PNG or JPEG image (repeatable): each <|image_pad|> of the prompt in turn; a --prompt "
      "that has none becomes a user turn of the chat template with the images before its text "
      "(without a template, the images go before the text)");
  generate
      ->add_option("-n,--n-predict", gen.n,
                   "Tokens to generate (default: generation_config.json's max_new_tokens, or 64)")
      ->transform(kNonNegative);
  generate->add_flag("--greedy", gen.greedy,
                     "Pick the most likely token (default unless generation_config.json samples)");
  generate->add_option("--temperature", gen.temperature, "Sampling temperature");
  generate->add_option("--top-k", gen.top_k, "Sample from the k most likely tokens (0: all)")
      ->transform(whole_number(0, INT32_MAX));
  generate->add_option("--top-p", gen.top_p, "Sample from the smallest set with this mass");
  generate->add_option("--min-p", gen.min_p,
                       "Drop tokens less likely than this fraction of the most likely one");
  generate->add_option("--repeat-penalty", gen.repeat_penalty,
                       "Repetition penalty over prompt and output (HF style; 1: off)");
  generate->add_option("--presence-penalty", gen.presence_penalty,
                       "Subtracted from the logit of every token already generated");
  generate->add_option("--frequency-penalty", gen.frequency_penalty,
                       "Subtracted from a token's logit once per time it was generated");
  generate
      ->add_option("--logit-bias", gen.logit_bias,
                   "ID=BIAS added to that token's logit (repeatable)")
      ->allow_extra_args(false);
  generate->add_option("--stop", gen.stop, "Stop before this text (repeatable)")
      ->allow_extra_args(false);
  auto* schema = generate->add_option(
      "-j,--json-schema", gen.json_schema,
      "Hold the output to this JSON schema (its text, or @FILE) (docs/structured_output.md)");
  auto* grammar = generate->add_option("--grammar", gen.grammar,
                                       "Hold the output to this GBNF grammar (its text, or @FILE)");
  generate
      ->add_option("--response-format", gen.response_format,
                   "An OpenAI response_format object (JSON text, or @FILE): json_object, "
                   "json_schema, grammar (gbnf or lark), regex, ...")
      ->excludes(schema)
      ->excludes(grammar);
  schema->excludes(grammar);
  generate->add_option("--seed", gen.seed, "Random seed (default: random, printed)")
      ->transform(kSeed);
  generate->add_flag("--print-ids", gen.print_ids,
                     "Print the generated ids, comma-separated, on one line instead of text");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "Do not stop at the end-of-sequence ids");
  add_speculative_options(generate, gen.speculative,
                          "Speculative decoding: none, ngram (prompt lookup) or draft:DIR (a "
                          "smaller model with the same tokenizer); greedy output is the same, "
                          "sampled output has the same distribution");
  generate->add_flag("--verify", gen.verify, "Bundles: check every file's sha256 before loading");
  add_threads_option(generate, gen.threads);
  add_device_options(generate, gen.devices);

  qhx::cli::ChatArgs chat_args;
  CLI::App* chat = app.add_subcommand("chat", "Interactive chat in the terminal (/help inside)");
  chat->add_option("--model,-m", chat_args.model, "Bundle, pack, or checkpoint directory")
      ->required();
  chat->add_option("--system", chat_args.system, "System prompt");
  chat->add_option("-n,--max-new-tokens", chat_args.max_new_tokens, "Longest reply in tokens")
      ->transform(kPositive);
  chat->add_option("-c,--ctx-size", chat_args.context_length,
                   "Context length (default: the model's, lowered to fit in memory)")
      ->transform(kNonNegative);
  auto* think = chat->add_flag_callback(
      "--think", [&] { chat_args.thinking = true; }, "Thinking on (default: the template's)");
  chat->add_flag_callback(
          "--no-think", [&] { chat_args.thinking = false; }, "Thinking off")
      ->excludes(think);
  chat->add_flag("--greedy", chat_args.greedy, "Most likely tokens instead of sampling");
  add_speculative_options(chat, chat_args.speculative,
                          "Speculative decoding: none, ngram (prompt lookup) or draft:DIR (a "
                          "smaller model with the same tokenizer); replies as without");
  chat->add_option("--seed", chat_args.seed, "Random seed")->transform(kSeed);
  chat->add_flag("--stats", chat_args.stats, "Print prompt reuse and speed after every reply");
  add_threads_option(chat, chat_args.threads);
  add_device_options(chat, chat_args.devices);

  qhx::cli::EmbedArgs embed_args;
  CLI::App* embed = app.add_subcommand(
      "embed", "Sentence embeddings of texts, one JSON array per input (docs/embeddings.md)");
  embed->add_option("--model,-m", embed_args.model, "Embedding checkpoint or bundle directory")
      ->required();
  embed->add_option("--prompt,-p", embed_args.prompts, "A text to embed (repeatable)")
      ->allow_extra_args(false);
  embed->add_option("--file,-f", embed_args.file,
                    "Embed each non-empty line of this file (-: stdin), after the --prompt texts");
  auto* prompt_name = embed->add_option(
      "--prompt-name", embed_args.prompt_name,
      "Put the model's prompt of this name before each input (Qwen3-Embedding: query)");
  auto* instruct = embed->add_option(
      "--instruct", embed_args.instruct,
      "Queries for this task: 'Instruct: TASK\\nQuery:' before each input (Qwen3-Embedding)");
  auto* prefix =
      embed->add_option("--prefix", embed_args.prefix, "Put this text before each input");
  prompt_name->excludes(instruct)->excludes(prefix);
  instruct->excludes(prefix);
  embed
      ->add_option("--pooling", embed_args.pooling,
                   "last, mean or cls (default: the checkpoint's 1_Pooling/config.json)")
      ->check(CLI::IsMember({"last", "mean", "cls"}));
  embed->add_flag("--no-normalize", embed_args.no_normalize,
                  "Leave the vectors as pooled (default: the checkpoint's; L2 with --pooling)");
  embed
      ->add_option("--dimensions", embed_args.dimensions,
                   "Keep the first N dimensions (Matryoshka), normalized after the cut")
      ->transform(whole_number(1, INT32_MAX));
  embed
      ->add_option("--format", embed_args.format,
                   "json (an array per line), openai (the /v1/embeddings answer) or similarity "
                   "(the cosine matrix of the inputs)")
      ->check(CLI::IsMember({"json", "openai", "similarity"}));
  add_threads_option(embed, embed_args.threads);
  add_device_options(embed, embed_args.devices);

  std::string tokenize_model;
  CLI::App* tokenize =
      app.add_subcommand("tokenize", "Read UTF-8 text on stdin, print its token ids as JSON");
  tokenize->add_option("--model,-m", tokenize_model, "Directory with tokenizer.json")->required();

  qhx::cli::TemplateArgs template_args;
  CLI::App* template_cmd = app.add_subcommand(
      "template", "Render the chat template for {\"messages\", \"tools\"} JSON on stdin");
  template_cmd->add_option("--model,-m", template_args.model, "Directory with the tokenizer")
      ->required();
  template_cmd->add_flag("--no-generation-prompt", template_args.no_generation_prompt,
                         "Do not open an assistant turn at the end");
  template_cmd
      ->add_option("--enable-thinking", template_args.enable_thinking,
                   "Pass enable_thinking (true or false) to the template")
      ->transform(CLI::IsMember({"true", "false"}));

  qhx::cli::ForgeArgs forge_args;
  CLI::App* forge = app.add_subcommand("forge", "Build bundles from Hugging Face checkpoints");
  forge->require_subcommand(1);
  CLI::App* convert = forge->add_subcommand("convert", "Convert a checkpoint into a gated bundle");
  convert->add_option("source", forge_args.source, "Hugging Face checkpoint directory")->required();
  convert->add_option("-o,--output", forge_args.out, "Bundle directory to create")->required();
  convert->add_option("--weights", forge_args.weights, "Decoder matrices: f32, bf16, f16, w8, w4");
  convert->add_option("--lm-head", forge_args.lm_head, "lm_head dtype (default: --weights)");
  convert->add_option("--embed", forge_args.embed, "Embedding table dtype (default: --weights)");
  convert->add_option("--group-size", forge_args.group_size, "W4 group width")
      ->transform(kPositive);
  convert
      ->add_option("--calibrate", forge_args.calibrate,
                   "Text like what the model will read (repeatable): W8/W4 scales and rounding "
                   "are chosen for the inputs each matrix meets on it")
      ->check(CLI::ExistingFile);
  convert
      ->add_option("--calibration-method", forge_args.calibration_method,
                   "gptq (rounding errors fed forward through the inputs' statistics) or "
                   "weighted (scales searched under the inputs' importance)")
      ->check(CLI::IsMember({"gptq", "weighted"}));
  convert
      ->add_option("--calibrate-tokens", forge_args.calibrate_tokens,
                   "The most calibration tokens read")
      ->check(CLI::PositiveNumber);
  convert->add_option("--size-budget", forge_args.size_budget,
                      "Mixed precision (w4, with --calibrate): weights of at most this many bytes "
                      "(K, M, G: powers of 1024), the most sensitive matrices kept in W8");
  convert
      ->add_option("--sensitivity-tokens", forge_args.sensitivity_tokens,
                   "Calibration tokens each matrix's sensitivity is measured on")
      ->check(CLI::PositiveNumber);
  auto* shards_opt =
      convert->add_option("--shards", forge_args.shards, "Decoder shards")->transform(kPositive);
  convert
      ->add_option("--max-shard-bytes", forge_args.max_shard_bytes,
                   "Split decoder layers into shards of at most this size")
      ->excludes(shards_opt)
      ->transform(kNonNegative);
  convert->add_option("--target", forge_args.target,
                      "generic, x86_64, x86_64-avx2, x86_64-avx512, aarch64, aarch64-dotprod");
  convert
      ->add_option("--max-ctx", forge_args.max_context,
                   "Context limit of the plan (0: the checkpoint's)")
      ->transform(kNonNegative);
  convert->add_option("--activations", forge_args.activations,
                      "W8/W4 matrices multiply int8-quantized or f32 activations: auto (int8 if "
                      "the gate accepts it), int8, f32");
  convert->add_flag("--no-gate", forge_args.no_gate, "Publish without running the oracle gate");
  convert->add_flag("--force", forge_args.force, "Replace an existing bundle");
  CLI::App* gate = forge->add_subcommand("gate", "Compare a bundle with its reference");
  gate->add_option("bundle", forge_args.source, "Bundle directory")->required();
  gate->add_option("--reference", forge_args.reference, "Hugging Face checkpoint or f32 bundle")
      ->required();
  gate->add_flag("--json", forge_args.json, "Also print the report as one JSON object on stdout");
  for (CLI::App* sub : {convert, gate}) {
    sub->add_option("--gate-prompts", forge_args.suite.prompts, "Prompts in the built-in suite")
        ->transform(kPositive);
    sub->add_option("--gate-prompt-file", forge_args.suite.prompt_file,
                    "Gate on these prompts instead: one per non-empty line (needs a tokenizer)");
    sub->add_option("--gate-tokens", forge_args.suite.greedy_tokens, "Greedy tokens per prompt")
        ->transform(kPositive);
    sub->add_option("--min-top1", forge_args.min_top1, "Gate threshold: top-1 agreement");
    sub->add_option("--min-top5", forge_args.min_top5, "Gate threshold: top-5 overlap");
    sub->add_option("--min-pearson", forge_args.min_pearson, "Gate threshold: Pearson r");
    sub->add_option("--max-kl", forge_args.max_kl, "Gate threshold: mean KL (nats)");
    sub->add_option("--min-greedy", forge_args.min_greedy,
                    "Gate threshold: fraction of identical greedy continuations");
  }

  qhx::cli::NpuPackArgs npu_args;
  CLI::App* npu = forge->add_subcommand(
      "npu", "Compile a bundle's prompt graphs for Hexagon NPUs into a pack (one folder per chip)");
  npu->add_option("bundle", npu_args.bundle, "Bundle directory (the base the pack pairs with)")
      ->required();
  npu->add_option("-o,--output", npu_args.out, "Pack directory to create")->required();
  npu->add_option("--chips", npu_args.chips,
                  "Hexagon generations, comma-separated (v73,v75,v79,v81)");
  npu->add_option("--context-budget", npu_args.context_budget,
                  "Bytes of weights per context (default 1.5 GiB; an NPU maps about 3.5 GB)")
      ->transform(kNonNegative);
  npu->add_option("--qnn-lib", npu_args.qnn_lib,
                  "Folder of libQnnHtp.so and libQnnSystem.so (default: $QHX_QNN_LIB, beside "
                  "qhx, an installed onnxruntime_qnn)");
  npu->add_option("--form", npu_args.form,
                  "How the matmuls compute: fp16, w8a16 (int8 rows, 16-bit activations) or "
                  "w4a16 (4-bit blocks); default: the bundle's W8/W4 weights with --calibrate, "
                  "else fp16")
      ->check(CLI::IsMember({"fp16", "w8a16", "w4a16"}));
  npu->add_option("--calibrate", npu_args.calibrate,
                  "Text like what the model will read (repeatable): the 16-bit forms' activation "
                  "ranges are measured on it")
      ->check(CLI::ExistingFile);
  npu->add_option("--calibrate-tokens", npu_args.calibrate_tokens,
                  "The most calibration tokens read")
      ->check(CLI::PositiveNumber);
  npu->add_option("--suite", npu_args.suite,
                  "Prompts whose greedy continuations are compared with the CPU's into the "
                  "pack's acceptance (one per line, or a JSON string per line)")
      ->check(CLI::ExistingFile);
  npu->add_option("--suite-tokens", npu_args.suite_tokens, "Greedy tokens followed per prompt")
      ->check(CLI::PositiveNumber);
  npu->add_flag("--decode", npu_args.decode,
                "Pack the decode steps' graphs too (--decode-device hexagon loads them; they hold "
                "the layers' weights a second time) and measure the acceptance with the replies "
                "decoded on the NPU");
  npu->add_option("--decode-context", npu_args.decode_context,
                  "The longest KV cache the packed attention graphs cover (default: the model's "
                  "max_position_embeddings; longer caches compile their graph on first use)")
      ->check(CLI::PositiveNumber);
  npu->add_flag("--no-check", npu_args.no_check,
                "Publish without comparing the NPU with the CPU (layout and size runs on random "
                "weights; the manifest and card say so)");
  npu->add_flag("--force", npu_args.force, "Replace an existing pack");

  qhx::cli::DraftVocabArgs draft_vocab_args;
  CLI::App* draft_vocab = forge->add_subcommand(
      "draft-vocab", "The tokens an MTP head drafts from (draft_vocab.json), from sample text");
  draft_vocab->add_option("model", draft_vocab_args.model, "Checkpoint (or bundle) directory")
      ->required();
  draft_vocab->add_option("--text", draft_vocab_args.texts, "UTF-8 text files like the model's use")
      ->required();
  draft_vocab
      ->add_option("--coverage", draft_vocab_args.coverage,
                   "Share of the text's tokens the list covers (default 0.999)")
      ->check(CLI::Range(0.0, 1.0));
  draft_vocab->add_option("--max-tokens", draft_vocab_args.max_tokens, "At most this many tokens")
      ->transform(kNonNegative);
  draft_vocab->add_option("-o,--output", draft_vocab_args.out,
                          "File to write (default: <model>/draft_vocab.json)");

  qhx::cli::BenchArgs bench_args;
  CLI::App* bench = app.add_subcommand("bench", "Prefill and decode speed, TTFT, memory");
  bench->add_option("model", bench_args.model, "Bundle, pack, or checkpoint directory")->required();
  bench->add_option("-p,--n-prompt", bench_args.prompts, "Prompt lengths, comma-separated");
  bench->add_option("-n,--n-gen", bench_args.n_gen, "Decoded tokens")->transform(kNonNegative);
  bench->add_option("-d,--depth", bench_args.depths,
                    "Context tokens before the decode is timed, comma-separated");
  bench->add_option("-r,--repetitions", bench_args.repetitions, "Repetitions")
      ->transform(kPositive);
  bench
      ->add_option("--turns", bench_args.turns,
                   "Multi-turn chat instead: N turns of -p user tokens and -n reply tokens, "
                   "TTFT with the state kept vs. a fresh session")
      ->transform(kPositive);
  bench->add_flag("--json", bench_args.json, "One JSON object per configuration on stdout");
  bench->add_flag("--profile", bench_args.devices.profile,
                  "The device's time per op kind, weight type and kernel in the timed runs "
                  "(timestamps on the device), against its peaks measured first (Vulkan)");
  add_speculative_options(bench, bench_args.speculative,
                          "Speculative decoding instead: -n greedy tokens after --prompt-file's "
                          "text, with and without drafts (ngram or draft:DIR), and what a verify "
                          "pass costs");
  bench->add_option("--prompt-file", bench_args.prompt_file,
                    "With --speculative: the prompt; with --context-sweep: the text read (UTF-8)");
  bench
      ->add_option("--image", bench_args.images,
                   "The image benchmark instead (repeatable): a PNG or JPEG file, or WxH for a "
                   "random image of that size; times reading, the vision tower and the prompt")
      ->excludes(bench->get_option("--turns"));
  bench->add_flag("--context-sweep", bench_args.context_sweep,
                  "Instead: greedy replies after growing depths of --prompt-file's text, where "
                  "they first depart from the reference's and whether they stay coherent");
  bench->add_option("--sweep-depths", bench_args.sweep_depths,
                    "Depths, comma-separated (default: 128, 256, ... to the model's context)");
  bench->add_option("--sweep-tokens", bench_args.sweep_tokens, "Reply tokens per depth")
      ->transform(kPositive);
  bench->add_option("--reference", bench_args.reference,
                    "The sweep's reference model, on the CPU (default: the model, CPU alone)");
  add_threads_option(bench, bench_args.threads);
  add_device_options(bench, bench_args.devices);

  qhx::cli::PerplexityArgs ppl;
  CLI::App* perplexity_cmd =
      app.add_subcommand("perplexity", "Score a UTF-8 text file: perplexity over windows");
  perplexity_cmd->add_option("--model,-m", ppl.model, "Bundle, pack, or checkpoint directory")
      ->required();
  perplexity_cmd->add_option("--file,-f", ppl.file, "Text file")->required();
  perplexity_cmd->add_option("--window", ppl.window, "Tokens scored per window (context resets)")
      ->transform(kPositive);
  perplexity_cmd->add_option("--max-tokens", ppl.max_tokens, "Score only the first N tokens")
      ->transform(kNonNegative);
  perplexity_cmd->add_flag("--second-half", ppl.second_half,
                           "Score as llama-perplexity does: windows that do not overlap, the "
                           "second half of each scored");
  perplexity_cmd
      ->add_option("--kl-divergence", ppl.kl_base,
                   "Also compare with BASE (bundle, pack or checkpoint; the float "
                   "model) on the same windows: mean KL divergence, top-1 agreement, "
                   "perplexity delta with its error")
      ->type_name("BASE");
  perplexity_cmd->add_flag("--json", ppl.json, "Print one JSON object");
  add_threads_option(perplexity_cmd, ppl.threads);
  add_device_options(perplexity_cmd, ppl.devices);

  qhx::cli::SynthArgs synth_args;
  CLI::App* synth = forge->add_subcommand(
      "synth", "Random-weight checkpoint or bundle with a real model's shapes (benchmarks)");
  std::string presets;
  for (const auto& name : qhx::synth_preset_names())
    presets += (presets.empty() ? "" : ", ") + name;
  synth->add_option("--preset", synth_args.preset, presets)->required();
  synth->add_option("-o,--output", synth_args.out, "Directory to create")->required();
  synth->add_option("--weights", synth_args.weights,
                    "Write a bundle with these weights (f32, bf16, f16, w8, w4) for this machine's "
                    "target; default: a bf16 Hugging Face-layout checkpoint");
  synth->add_option("--embed", synth_args.embed, "With --weights: embedding table dtype");
  synth->add_option("--lm-head", synth_args.lm_head, "With --weights: lm_head dtype");
  synth->add_option("--activations", synth_args.activations,
                    "With --weights w8/w4: auto (= int8, ungated), int8, f32");
  synth->add_option("--seed", synth_args.seed, "Random seed")->transform(kSeed);
  synth->add_flag("--vision", synth_args.vision,
                  "With a vision tower (Qwen3.5 presets; the Qwen3-VL-2B tower's shape, assumed)");

  std::string verify_bundle;
  CLI::App* verify = app.add_subcommand("verify", "Check a bundle's files against its manifest");
  verify->add_option("bundle", verify_bundle, "Bundle directory")->required();

  std::string pack_out;
  std::vector<std::string> pack_bundles;
  bool pack_force = false;
  CLI::App* pack = app.add_subcommand("pack", "Gather bundles for several targets into a pack");
  pack->add_option("bundles", pack_bundles, "Bundle directories, one per target")->required();
  pack->add_option("-o,--output", pack_out, "Pack directory to create")->required();
  pack->add_flag("--force", pack_force, "Replace an existing pack");

  qhx::cli::ServeArgs serve_args;
  CLI::App* serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/server.md)");
  serve->add_option("--model,-m", serve_args.model, "Bundle, pack, or checkpoint directory")
      ->required();
  serve->add_option("--host", serve_args.server.host, "Address to listen on");
  serve->add_option("--port", serve_args.server.port, "Port (0: any free one)")
      ->transform(whole_number(0, 65535));
  serve->add_option("--parallel", serve_args.server.parallel, "Sessions served at once (slots)")
      ->transform(whole_number(1, 256));
  serve
      ->add_option("--queue", serve_args.server.queue,
                   "Requests that may wait for a slot; past them, 429")
      ->transform(whole_number(0, 4096));
  serve
      ->add_option("--ctx-size,-c", serve_args.ctx_size,
                   "Tokens per session (default: as many as the model and memory allow)")
      ->transform(kNonNegative);
  serve->add_option("--cache-mb", serve_args.cache_mb, "Prefix cache shared by the slots, MB")
      ->transform(whole_number(0, 1 << 20));
  serve
      ->add_option("--max-request-bytes", serve_args.server.max_request_bytes,
                   "Larger request bodies get 413")
      ->transform(kPositive);
  serve->add_option("--alias", serve_args.server.alias,
                    "Model id for clients (default: the model directory's name)");
  serve
      ->add_option("--api-key", serve_args.server.api_key,
                   "Clients must send 'Authorization: Bearer KEY' (all but /health)")
      ->envname("QHX_API_KEY")
      ->check(not_empty("an empty key would turn authentication off: give a key, or leave "
                        "--api-key and QHX_API_KEY unset"));
  serve->add_option("--cors-origin", serve_args.server.cors_origins,
                    "Web page origin allowed to call the server (repeat; '*': any)");
  serve->add_option("--allowed-host", serve_args.server.allowed_hosts,
                    "Host header name answered besides the --host address (repeat; '*': any)");
  serve
      ->add_option("--max-connections", serve_args.server.max_connections,
                   "Open connections at most; past it new ones are closed")
      ->transform(whole_number(1, 65536));
  serve
      ->add_option("--timeout", serve_args.server.timeout_seconds,
                   "Seconds a client has to send a request (and may stall reading an answer)")
      ->transform(whole_number(1, 3600));
  serve->add_flag("--verify", serve_args.verify,
                  "Bundles: check every file's sha256 before serving");
  add_threads_option(serve, serve_args.threads);
  add_device_options(serve, serve_args.devices);
  add_speculative_options(serve, serve_args.speculative,
                          "Speculative decoding of every request: none, ngram (prompt lookup) or "
                          "draft:DIR (a smaller model with the same tokenizer); greedy replies "
                          "are the same, sampled ones have the same distribution");

  CLI::App* devices_cmd =
      app.add_subcommand("devices", "List the devices qhx can run on (for --device)");

  CLI11_PARSE(app, argc, argv);
  try {
    if (generate->parsed()) {
      if (gen.prompt.empty() && gen.prompt_ids.empty()) {
        qhx::fail("generate", "give --prompt or --prompt-ids");
      }
      return qhx::cli::run_generate(gen);
    }
    if (chat->parsed()) return qhx::cli::run_chat(chat_args);
    if (embed->parsed()) return qhx::cli::run_embed(embed_args);
    if (convert->parsed()) return qhx::cli::run_convert(forge_args);
    if (npu->parsed()) return qhx::cli::run_forge_npu(npu_args);
    if (gate->parsed()) return qhx::cli::run_gate(forge_args);
    if (synth->parsed()) return qhx::cli::run_synth(synth_args);
    if (draft_vocab->parsed()) return qhx::cli::run_draft_vocab(draft_vocab_args);
    if (verify->parsed()) return qhx::cli::run_verify(verify_bundle);
    if (perplexity_cmd->parsed()) return qhx::cli::run_perplexity(ppl);
    if (bench->parsed()) return qhx::cli::run_bench(bench_args);
    if (pack->parsed()) return qhx::cli::run_pack(pack_out, pack_bundles, pack_force);
    if (serve->parsed()) return qhx::cli::run_serve(serve_args);
    if (template_cmd->parsed()) return qhx::cli::run_template(template_args);
    if (devices_cmd->parsed()) return qhx::cli::run_devices();
    return qhx::cli::run_tokenize(tokenize_model);
  } catch (const qhx::Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // file system and allocation failures
    std::cout.flush();
    std::fprintf(stderr, "qhx: error: %s\n", e.what());
    return 1;
  }
}
