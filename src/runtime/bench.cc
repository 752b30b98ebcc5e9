#include "runtime/bench.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "kernels/cpu_context.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "util/clock.h"
#include "util/error.h"

namespace qhx {
namespace {

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(n);
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

}  // namespace

Spread Spread::of(const std::vector<double>& samples) {
  Spread s;
  if (samples.empty()) return s;
  const double n = static_cast<double>(samples.size());
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / n;
  double var = 0;
  for (const double x : samples) var += (x - s.mean) * (x - s.mean);
  s.stddev = samples.size() > 1 ? std::sqrt(var / (n - 1)) : 0.0;
  s.min = *std::min_element(samples.begin(), samples.end());
  s.max = *std::max_element(samples.begin(), samples.end());
  return s;
}

BenchResult run_bench(const Model& model, const BenchConfig& config) {
  const int64_t vocab = model.config().vocab_size;
  const int64_t context = model.config().max_position_embeddings;
  if (config.repetitions < 1) fail("bench", "at least one repetition is needed");
  if (config.n_prompt < 0 || config.n_gen < 0 || config.depth < 0) {
    fail("bench", "token counts must not be negative");
  }
  if (std::max(config.n_prompt, config.depth + config.n_gen) > context) {
    fail("bench", "the configuration needs more than the model's context of " +
                      std::to_string(context) + " tokens");
  }
  std::mt19937_64 rng(config.seed);
  BenchResult result;
  result.config = config;
  std::vector<double> prefill, ttft, decode, first_step;
  std::vector<float> logits;
  // The profiles of the timed runs: what the devices did before each is dropped.
  result.prefill_profiles.resize(config.profiled.size());
  result.decode_profiles.resize(config.profiled.size());
  const auto drop_profiles = [&] {
    for (Backend* b : config.profiled) b->take_profile();
  };
  const auto add_profiles = [&](std::vector<DeviceProfile>& to) {
    for (size_t i = 0; i < config.profiled.size(); ++i) to[i] += config.profiled[i]->take_profile();
  };
  const auto state = model.new_state();
  state->reserve(std::max(config.n_prompt, config.depth + config.n_gen));
  // Warm-up, untimed, as llama-bench's: a prompt of the timed length sizes the scratch buffers
  // (else the first repetition pays their page faults: 0.6B pp512 ran about 200 tok/s slower in
  // it, ±90 over 3 repetitions instead of ±7-20), then two tokens decode.
  if (config.n_prompt > 0) {
    model.forward(random_ids(config.n_prompt, vocab, rng), *state, LogitsFor::kLastToken, logits);
    state->reset();  // a prompt of the whole context leaves no room for the decoded two
  }
  for (const int32_t id : random_ids(2, vocab, rng)) {
    model.forward(std::span<const int32_t>(&id, 1), *state, LogitsFor::kLastToken, logits);
  }
  for (int64_t r = 0; r < config.repetitions; ++r) {
    if (config.n_prompt > 0) {
      const std::vector<int32_t> prompt = random_ids(config.n_prompt, vocab, rng);
      state->reset();
      const DeviceTraffic before = model.device_traffic();
      drop_profiles();
      const auto start = Clock::now();
      model.forward(prompt, *state, LogitsFor::kLastToken, logits);
      const double prefill_s = seconds_since(start);
      add_profiles(result.prefill_profiles);
      int32_t token = argmax(logits);
      ttft.push_back(seconds_since(start) * 1e3);
      prefill.push_back(static_cast<double>(config.n_prompt) / prefill_s);
      result.prefill_traffic += model.device_traffic() - before;
      ++result.prefill_passes;
      if (config.n_gen > 0 && config.n_prompt < context) {
        const auto step = Clock::now();
        model.forward(std::span<const int32_t>(&token, 1), *state, LogitsFor::kLastToken, logits);
        first_step.push_back(seconds_since(step) * 1e3);
      }
    }
    if (config.n_gen > 0) {
      state->reset();
      if (config.depth > 0) {
        model.forward(random_ids(config.depth, vocab, rng), *state, LogitsFor::kLastToken, logits);
      }
      int32_t token = random_ids(1, vocab, rng)[0];
      const DeviceTraffic before = model.device_traffic();
      drop_profiles();
      const auto start = Clock::now();
      for (int64_t i = 0; i < config.n_gen; ++i) {  // greedy: each step feeds the last pick
        model.forward(std::span<const int32_t>(&token, 1), *state, LogitsFor::kLastToken, logits);
        token = argmax(logits);
      }
      decode.push_back(static_cast<double>(config.n_gen) / seconds_since(start));
      add_profiles(result.decode_profiles);
      result.decode_traffic += model.device_traffic() - before;
      result.decode_steps += config.n_gen;
    }
  }
  result.state_bytes = state->bytes();
  result.decode_step_bytes = model.decode_step_bytes(config.depth + config.n_gen / 2);
  result.prefill_tok_s = Spread::of(prefill);
  result.ttft_ms = Spread::of(ttft);
  result.first_step_ms = Spread::of(first_step);
  result.decode_tok_s = Spread::of(decode);
  return result;
}

double read_bandwidth(CpuContext& cx, int64_t bytes, int passes) {
  const int64_t threads = cx.threads();
  const int64_t words = bytes / static_cast<int64_t>(sizeof(uint64_t)) / threads * threads;
  void* p = ::mmap(nullptr, words * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0.0;
  auto* data = static_cast<uint64_t*>(p);
  for (int64_t i = 0; i < words; ++i) data[i] = static_cast<uint64_t>(i);  // distinct pages
  std::vector<uint64_t> sums(threads);
  double best = 0.0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = Clock::now();
    cx.run(threads, [&](int64_t t, Scratch&) {
      // Four sums, so that the loads, not one chain of adds, set the pace.
      const uint64_t* slice = data + t * (words / threads);
      uint64_t s[4] = {0, 0, 0, 0};
      for (int64_t i = 0; i + 4 <= words / threads; i += 4) {
        for (int j = 0; j < 4; ++j) s[j] += slice[i + j];
      }
      sums[t] = s[0] + s[1] + s[2] + s[3];
    });
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds_since(start));
  }
  ::munmap(p, words * sizeof(uint64_t));
  // The sums are the point of the reads: a compiler may not drop loads whose result is used.
  volatile uint64_t sink = std::accumulate(sums.begin(), sums.end(), uint64_t{0});
  (void)sink;
  return best;
}

std::vector<ChatBenchTurn> run_chat_bench(const Model& model, const ChatBenchConfig& config) {
  if (config.turns < 1 || config.user_tokens < 1 || config.reply_tokens < 1) {
    fail("bench", "a chat needs at least one turn, user token and reply token");
  }
  const int64_t needed = config.turns * (config.user_tokens + config.reply_tokens);
  if (needed > model.config().max_position_embeddings) {
    fail("bench", "the chat needs " + std::to_string(needed) + " tokens, more than the model's " +
                      "context of " + std::to_string(model.config().max_position_embeddings));
  }
  std::mt19937_64 rng(config.seed);
  const int64_t vocab = model.config().vocab_size;
  Session chat(model);
  std::vector<int32_t> conversation;
  std::vector<ChatBenchTurn> turns;
  TurnOptions options;
  options.max_new_tokens = config.reply_tokens;
  TurnOptions first_token = options;
  first_token.max_new_tokens = 1;
  const auto keep = [&](int32_t id) {
    conversation.push_back(id);
    return true;
  };
  {  // Warm-up, untimed: touches every weight page and sizes the scratch buffers.
    Session warm(model);
    warm.generate(random_ids(config.user_tokens, vocab, rng), first_token,
                  [](int32_t) { return true; });
  }
  for (int64_t t = 0; t < config.turns; ++t) {
    const std::vector<int32_t> user = random_ids(config.user_tokens, vocab, rng);
    conversation.insert(conversation.end(), user.begin(), user.end());
    ChatBenchTurn turn;
    turn.n_prompt = static_cast<int64_t>(conversation.size());
    {
      Session fresh(model);
      turn.ttft_fresh_ms =
          fresh.generate(conversation, first_token, [](int32_t) { return true; }).ttft_seconds *
          1e3;
    }
    const std::vector<int32_t> prompt = conversation;
    const TurnStats stats = chat.generate(prompt, options, keep);
    turn.n_processed = stats.n_processed;
    turn.ttft_ms = stats.ttft_seconds * 1e3;
    turn.decode_tok_s = stats.n_generated > 1
                            ? static_cast<double>(stats.n_generated - 1) / stats.decode_seconds
                            : 0.0;
    turns.push_back(turn);
  }
  return turns;
}

SpeculativeBenchResult run_speculative_bench(const Model& model,
                                             const SpeculativeBenchConfig& config) {
  if (config.prompt.empty() || config.n_gen < 2 || config.repetitions < 1) {
    fail("bench", "a speculative run needs a prompt, at least 2 new tokens and 1 repetition");
  }
  SpeculativeBenchResult result;
  std::vector<double> plain, speculative;
  std::vector<int32_t> first_reply;
  const auto run = [&](bool speculate) {
    Session session(model);
    TurnOptions options;
    options.max_new_tokens = config.n_gen;
    if (speculate) options.speculative = config.speculative;
    std::vector<int32_t> reply;
    const TurnStats stats = session.generate(config.prompt, options, [&](int32_t id) {
      reply.push_back(id);
      return true;
    });
    if (first_reply.empty()) first_reply = reply;
    result.same_tokens = result.same_tokens && reply == first_reply;
    result.n_generated = stats.n_generated;
    if (speculate) {
      result.verify_passes = stats.verify_passes;
      result.drafted = stats.drafted;
      result.accepted = stats.accepted;
      result.decode_passes = stats.decode_passes;
      result.rollbacks = stats.rollbacks;
    }
    return static_cast<double>(stats.n_generated - 1) / std::max(stats.decode_seconds, 1e-9);
  };
  run(false);  // warm-up, untimed
  for (int64_t r = 0; r < config.repetitions; ++r) {
    plain.push_back(run(false));
    speculative.push_back(run(true));
  }
  result.plain_tok_s = Spread::of(plain);
  result.speculative_tok_s = Spread::of(speculative);

  // The parts, at the prompt's depth, each the best of the rounds.
  const auto at_prompt = model.new_state();
  std::vector<float> logits;
  model.forward(config.prompt, *at_prompt, LogitsFor::kLastToken, logits);
  const auto best_ms = [&](int64_t n_tokens, LogitsFor which) {
    double best = 1e300;
    const std::vector<int32_t> ids(n_tokens, config.prompt.back());
    for (int64_t r = 0; r < std::max<int64_t>(config.repetitions, 3); ++r) {
      const auto state = at_prompt->clone();
      const auto start = Clock::now();
      model.forward(ids, *state, which, logits);
      best = std::min(best, seconds_since(start) * 1e3);
    }
    return best;
  };
  result.step_ms = best_ms(1, LogitsFor::kLastToken);
  for (int64_t k = 1; k <= config.speculative.draft_max; ++k) {
    result.verify_ms.push_back(best_ms(k + 1, LogitsFor::kEveryStep));
  }
  if (!at_prompt->can_truncate()) {
    double best = 1e300;
    for (int r = 0; r < 5; ++r) {
      const auto start = Clock::now();
      const StateCheckpoint c = at_prompt->checkpoint();
      best = std::min(best, seconds_since(start) * 1e3);
    }
    result.checkpoint_ms = best;
  }
  return result;
}

ImageBenchResult run_image_bench(const Model& model, const PixelValues& pixels,
                                 int64_t repetitions) {
  if (repetitions < 1) fail("bench", "at least one repetition is needed");
  const ModelConfig& c = model.config();
  ImageBenchResult r;
  r.patches = pixels.grid.patches();
  std::vector<int32_t> prompt = {c.vision_start_token_id};
  const std::vector<int32_t> image = model.image_ids(pixels);  // also the untimed warm-up
  r.tokens = static_cast<int64_t>(image.size());
  prompt.insert(prompt.end(), image.begin(), image.end());
  prompt.push_back(c.vision_end_token_id);
  for (int32_t t = 0; t < 8; ++t) prompt.push_back(t);
  std::vector<double> encode, prefill;
  std::vector<float> logits;
  model.forward(prompt, *model.new_state(), LogitsFor::kLastToken, logits);  // warm-up
  for (int64_t i = 0; i < repetitions; ++i) {
    Clock::time_point start = Clock::now();
    const std::vector<float> features = model.image_features(pixels);
    encode.push_back(seconds_since(start) * 1e3);
    const std::unique_ptr<ModelState> state = model.new_state();
    start = Clock::now();
    model.forward(prompt, *state, LogitsFor::kLastToken, logits);
    prefill.push_back(seconds_since(start) * 1e3);
  }
  r.encode_ms = Spread::of(encode);
  r.prefill_ms = Spread::of(prefill);
  return r;
}

}  // namespace qhx
