// The context sweep (runtime/context_sweep.h) on the KJV models: a model never departs from
// itself, another model's replies depart and are scored by the reference, and depths the text or
// the context cannot hold are refused.
#include "runtime/context_sweep.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace qhx {
namespace {

const std::filesystem::path kQwen3 = test::source_dir() / "models/qwen3-kjv";
const std::filesystem::path kQwen35 = test::source_dir() / "models/qwen3.5-kjv";

std::vector<int32_t> held_out_ids(int64_t n) {
  std::ifstream in(kQwen3 / "held_out.txt", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids = Tokenizer::load(kQwen3).encode(text);
  ids.resize(static_cast<size_t>(n));
  return ids;
}

TEST(ContextSweep, AModelAgreesWithItselfAndAnotherDepartsLessLikely) {
  const auto qwen3 = load_model(kQwen3), qwen35 = load_model(kQwen35);
  const std::vector<int32_t> text = held_out_ids(300);
  const std::vector<int64_t> depths = {40, 300};
  const std::vector<SweepPoint> same = context_sweep(*qwen3, *qwen3, text, depths, 12);
  ASSERT_EQ(same.size(), 2u);
  for (const SweepPoint& p : same) {
    EXPECT_EQ(p.first_departure, -1);
    EXPECT_EQ(p.length, p.reference_length);
    EXPECT_GT(p.length, 0);
    EXPECT_EQ(p.nll, p.reference_nll);
    EXPECT_TRUE(p.coherent);
  }
  EXPECT_EQ(same[1].depth, 300);

  // Another model trained on the same text: its replies are its own, scored by the reference.
  const std::vector<SweepPoint> other = context_sweep(*qwen35, *qwen3, text, depths, 12);
  bool departed = false;
  for (const SweepPoint& p : other) {
    departed = departed || p.first_departure >= 0;
    if (p.first_departure >= 0) {
      EXPECT_NE(p.nll, p.reference_nll) << p.depth;
    }
    EXPECT_GT(p.length, 0);
  }
  EXPECT_TRUE(departed);

  test::expect_error([&] { context_sweep(*qwen3, *qwen3, text, std::vector<int64_t>{301}, 4); },
                     {"depth 301", "300 given"});
  const std::vector<int64_t> too_deep = {300};
  test::expect_error([&] { context_sweep(*qwen3, *qwen3, text, too_deep, 4000); },
                     {"depth 300", "4096 positions"});
}

TEST(ContextSweep, DefaultDepthsArePowersOfTwoThenTheDeepestThatFits) {
  EXPECT_EQ(default_sweep_depths(4096, 20000, 32),
            (std::vector<int64_t>{128, 256, 512, 1024, 2048, 4064}));
  EXPECT_EQ(default_sweep_depths(1024, 5000, 1), (std::vector<int64_t>{128, 256, 512, 1023}));
  EXPECT_EQ(default_sweep_depths(100, 5000, 4), (std::vector<int64_t>{96}));
  // A text shorter than the context: the deepest is the whole text.
  EXPECT_EQ(default_sweep_depths(262144, 700, 32), (std::vector<int64_t>{128, 256, 512, 700}));
  EXPECT_EQ(default_sweep_depths(4096, 0, 32), (std::vector<int64_t>{}));
}

}  // namespace
}  // namespace qhx
