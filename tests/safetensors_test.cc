// Safetensors and checkpoint loading: valid files load in place, every malformed file gets an
// error that names the file and the tensor.
#include <gtest/gtest.h>

#include <fstream>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "support/raw_safetensors.h"
#include "util/error.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::RawSafetensors;

RawSafetensors sample_file() {
  RawSafetensors raw;
  const float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
  const uint16_t bf16[2] = {0x3F80, 0xC000};         // 1, -2
  const uint16_t f16[3] = {0x3C00, 0xC000, 0x0001};  // 1, -2, smallest subnormal
  raw.add("a", "F32", {2, 3}, f32, sizeof f32);
  raw.add("b", "BF16", {2}, bf16, sizeof bf16);
  raw.add("c", "F16", {3}, f16, sizeof f16);
  return raw;
}

TEST(Safetensors, LoadsTensorsInPlace) {
  test::TempDir dir;
  sample_file().write(dir.path() / "x.safetensors");
  const auto file = SafetensorsFile::open(dir.path() / "x.safetensors");
  ASSERT_EQ(file.tensors().size(), 3u);
  const TensorView* a = file.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[2], 3.5f);
  const auto* b = reinterpret_cast<const uint16_t*>(file.find("b")->data);
  EXPECT_EQ(bf16_to_f32(b[1]), -2.0f);
  const auto* c = reinterpret_cast<const uint16_t*>(file.find("c")->data);
  EXPECT_EQ(f16_to_f32(c[1]), -2.0f);
  EXPECT_EQ(f16_to_f32(c[2]), std::ldexp(1.0f, -24));
}

TEST(Safetensors, MisalignedDataIsCopiedToAlignedMemory) {
  test::TempDir dir;
  RawSafetensors raw;
  const char pad = 0;
  raw.add("pad", "U8", {1}, &pad, 1);
  const float values[2] = {1.5f, 2.5f};
  raw.add("f", "F32", {2}, values, sizeof values);
  raw.write(dir.path() / "x.safetensors");
  const auto file = SafetensorsFile::open(dir.path() / "x.safetensors");
  const TensorView* f = file.find("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data) % alignof(float), 0u);
  EXPECT_EQ(reinterpret_cast<const float*>(f->data)[1], 2.5f);
}

TEST(Safetensors, TruncatedFilesAreRejected) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  sample_file().write(path);
  const auto full = fs::file_size(path);
  for (uintmax_t size : {uintmax_t{0}, uintmax_t{5}, uintmax_t{20}, full - 1}) {
    fs::resize_file(path, size);
    expect_error([&] { SafetensorsFile::open(path); }, {path.string(), "truncated"});
    sample_file().write(path);
  }
}

TEST(Safetensors, OffsetsPastTheEndAreRejected) {
  test::TempDir dir;
  RawSafetensors raw = sample_file();
  raw.header["c"]["data_offsets"][1] = raw.data.size() + 100;
  raw.write(dir.path() / "x.safetensors");
  expect_error([&] { SafetensorsFile::open(dir.path() / "x.safetensors"); },
               {"x.safetensors", "'c'", "past the end"});
}

TEST(Safetensors, ByteRangeMustMatchShape) {
  test::TempDir dir;
  RawSafetensors raw = sample_file();
  raw.header["a"]["shape"] = {3, 3};
  raw.write(dir.path() / "x.safetensors");
  expect_error([&] { SafetensorsFile::open(dir.path() / "x.safetensors"); },
               {"'a'", "[3, 3]", "needs 36"});
}

TEST(Safetensors, MalformedHeadersAreRejected) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const std::string header = "{\"a\": {\"dtype\": ";
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  expect_error([&] { SafetensorsFile::open(path); }, {path.string(), "invalid JSON"});

  RawSafetensors raw = sample_file();
  raw.header["a"]["dtype"] = "Q4_K";
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); }, {"'a'", "unsupported dtype 'Q4_K'"});

  raw = sample_file();
  raw.header["b"].erase("data_offsets");
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); }, {"'b'", "data_offsets", "missing"});

  raw = sample_file();
  raw.header["b"]["shape"] = {-1};
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); }, {"'b'", "shape"});
}

TEST(Checkpoint, ShardedIndexIsFollowed) {
  test::TempDir dir;
  RawSafetensors first, second;
  const float one[2] = {1, 2}, two[3] = {3, 4, 5};
  first.add("x.weight", "F32", {2}, one, sizeof one);
  second.add("y.weight", "F32", {3}, two, sizeof two);
  first.write(dir.path() / "model-00001-of-00002.safetensors");
  second.write(dir.path() / "model-00002-of-00002.safetensors");
  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"x.weight": "model-00001-of-00002.safetensors",
            "y.weight": "model-00002-of-00002.safetensors"}})";
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.files().size(), 2u);
  EXPECT_EQ(reinterpret_cast<const float*>(ckpt.require("y.weight", {3}).data)[2], 5.0f);
  expect_error(
      [&] {
        ckpt.require("y.weight", {1, 3});
      },
      {"model-00002-of-00002.safetensors", "'y.weight'", "shape [3], expected [1, 3]"});
  expect_error([&] { ckpt.require("z.weight", {3}); }, {dir.path().string(), "'z.weight'"});

  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"weight_map": {"x.weight": "model-00001-of-00002.safetensors",
            "w.weight": "model-00002-of-00002.safetensors"}})";
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"model-00002-of-00002.safetensors", "'w.weight'", "missing"});

  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"weight_map": {"x.weight": "gone.safetensors"}})";
  expect_error([&] { Checkpoint::open(dir.path()); }, {"gone.safetensors", "cannot open"});
}

TEST(Checkpoint, EmptyDirectoryIsRejected) {
  test::TempDir dir;
  expect_error([&] { Checkpoint::open(dir.path()); },
               {dir.path().string(), "no model.safetensors"});
}

}  // namespace
}  // namespace qhx
