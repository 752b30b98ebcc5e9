// Safetensors and checkpoint loading: valid files load in place, every malformed file gets an
// error that names the file and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <tuple>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/expect_error.h"
#include "support/fixtures.h"
#include "support/raw_safetensors.h"
#include "util/error.h"
#include "util/json_file.h"

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

void write_verbatim(const fs::path& path, const std::string& header, const std::string& data);

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

  // A flipped bit that makes one tensor's name another's: the name is said to appear twice (it
  // was a hole in the data, blamed on an older writer).
  raw = sample_file();
  std::string text = raw.header.dump();
  const size_t at = text.find("\"b\"");
  ASSERT_NE(at, std::string::npos);
  text[at + 1] = 'a';
  write_verbatim(path, text, raw.data);
  expect_error([&] { SafetensorsFile::open(path); }, {path.string(), "'a' appears twice"});
}

// Writes a file whose header is `header` verbatim (no padding) followed by `data`.
void write_verbatim(const fs::path& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  out << header << data;
}

// The layout rules of the reference (safetensors' Metadata::validate): sorted by byte range, the
// tensors tile the data, from 0 to its end, with no hole and no overlap.
// Files with every layout question (tests/fixtures/safetensors/layouts, made by
// tools/oracle/make_safetensors_layouts.py): qhx accepts exactly those Hugging Face's
// safetensors library accepts, and refuses the others with a line naming the file.
TEST(Safetensors, AcceptsExactlyWhatTheReferenceAccepts) {
  const fs::path dir = test::source_dir() / "tests/fixtures/safetensors/layouts";
  const Json verdicts = read_json_file(dir / "verdicts.json");
  ASSERT_GE(verdicts.at("files").size(), 15u);
  for (const auto& [name, verdict] : verdicts.at("files").items()) {
    SCOPED_TRACE(name + ": the reference says " + verdict.dump());
    const fs::path path = dir / (name + ".safetensors");
    std::string error;
    try {
      SafetensorsFile::open(path);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_EQ(error.empty(), verdict.at("accepted").get<bool>()) << error;
    if (!error.empty()) {
      EXPECT_EQ(error.find(path.string()), 0u) << error;
      EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    }
  }
}

TEST(Safetensors, HoleBetweenTensorsIsRefused) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  RawSafetensors raw;
  const float f32[6] = {1, 2, 3, 4, 5, 6};
  raw.add("a", "F32", {6}, f32, sizeof f32);
  raw.data.append(32, '\0');  // as the old 64-byte-aligning writer left
  raw.add("b", "F32", {2}, f32, 8);
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); },
               {path.string() + ": tensor 'b': data_offsets: begins at 56 but the previous "
                                "tensor 'a' ends at 24 (a hole of 32 bytes; safetensors files "
                                "have none: a checkpoint from an older qhx forge synth must be "
                                "written again)"});
}

TEST(Safetensors, FirstTensorNotAtZeroIsAHole) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  RawSafetensors raw;
  raw.data.assign(16, '\0');
  const float f32[2] = {1, 2};
  raw.add("a", "F32", {2}, f32, sizeof f32);
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); },
               {path.string() + ": tensor 'a': data_offsets: begins at 16 but the data starts "
                                "at 0 (a hole of 16 bytes"});
}

TEST(Safetensors, OverlappingTensorsAreRefused) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  RawSafetensors raw;
  const float f32[3] = {1, 2, 3};
  raw.add("a", "F32", {2}, f32, 8);
  raw.add("b", "F32", {1}, f32 + 2, 4);
  raw.header["b"]["data_offsets"] = {4, 8};  // inside 'a'
  raw.data.resize(8);
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); },
               {path.string() + ": tensor 'b': data_offsets: begins at 4 and overlaps the "
                                "previous tensor 'a' (which ends at 8)"});
  // Two tensors over the same bytes overlap too.
  raw.header["b"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); }, {"'b'", "overlaps the previous tensor 'a'"});
}

TEST(Safetensors, BytesAfterTheLastTensorAreRefused) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  RawSafetensors raw = sample_file();
  raw.data.append(5, '\0');
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); },
               {path.string() + ": 5 bytes after the last tensor's end (the data must end where "
                                "the last tensor does)"});
  RawSafetensors empty;
  empty.data = "abc";
  empty.write(path);
  expect_error([&] { SafetensorsFile::open(path); },
               {path.string() + ": 3 bytes of data but the header lists no tensors"});
  empty.data.clear();
  empty.write(path);
  EXPECT_TRUE(SafetensorsFile::open(path).tensors().empty());
}

TEST(Safetensors, ZeroSizeTensorsFitAnywhere) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  RawSafetensors raw;
  const float f32[2] = {1, 2};
  raw.add("first", "F32", {0}, nullptr, 0);
  raw.add("a", "F32", {2}, f32, sizeof f32);
  raw.add("middle", "BF16", {3, 0}, nullptr, 0);
  raw.add("b", "F32", {1}, f32, 4);
  raw.add("last", "U8", {0}, nullptr, 0);
  raw.write(path);
  const auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), 5u);
  EXPECT_EQ(file.find("middle")->nbytes, 0u);
  EXPECT_EQ(file.find("middle")->shape, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(reinterpret_cast<const float*>(file.find("b")->data)[0], 1.0f);

  raw.header["last"]["data_offsets"] = {16, 16};  // past the data: a hole before it
  raw.data.append(4, '\0');
  raw.write(path);
  expect_error([&] { SafetensorsFile::open(path); },
               {"'last'", "begins at 16 but the previous tensor 'b' ends at 12"});
}

// As the reference reader (safetensors 0.8): whitespace around the JSON object is allowed, an
// empty header is not.
TEST(Safetensors, HeaderWhitespaceIsAllowedAsByTheReference) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  const std::string data(8, '\0');
  write_verbatim(path, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data);
  EXPECT_EQ(SafetensorsFile::open(path).tensors().size(), 1u);
  write_verbatim(path, R"( {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  )", data);
  EXPECT_EQ(SafetensorsFile::open(path).tensors().size(), 1u);
  write_verbatim(path, "", "");
  expect_error([&] { SafetensorsFile::open(path); }, {path.string() + ": header is empty"});
}

TEST(Safetensors, WriterLaysTensorsOutAsTheReferenceDoes) {
  test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  // Given out of order, mixed sizes: the file must still have every tensor aligned.
  const std::vector<SafetensorsEntry> entries = {
      {"w.small", DType::kU8, {3}},   {"b.bf16", DType::kBF16, {5}}, {"a.f32", DType::kF32, {2, 3}},
      {"c.i64", DType::kI64, {3}},    {"d.f16", DType::kF16, {1}},   {"e.f32", DType::kF32, {1}},
      {"empty", DType::kF32, {0, 4}}, {"f.i32", DType::kI32, {2}},   {"z.bool", DType::kBool, {2}},
      {"A.bf16", DType::kBF16, {7}},
  };
  auto pattern = [](size_t i, size_t k) { return static_cast<std::byte>(i * 37 + k * 11 + 1); };
  std::vector<int> calls(entries.size(), 0);
  std::vector<size_t> call_order;
  write_safetensors(path, entries, [&](size_t i, std::span<std::byte> bytes) {
    ASSERT_LT(i, entries.size());
    ++calls[i];
    call_order.push_back(i);
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = pattern(i, k);
  });
  EXPECT_EQ(calls, std::vector<int>(entries.size(), 1));

  // Read back: the bytes of each tensor, in place (aligned in the file, so not copied).
  const auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), entries.size());
  const std::span<const std::byte> all = file.bytes();
  for (size_t i = 0; i < entries.size(); ++i) {
    SCOPED_TRACE(entries[i].name);
    const TensorView* t = file.find(entries[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, entries[i].dtype);
    EXPECT_EQ(t->shape, entries[i].shape);
    EXPECT_TRUE(t->data >= all.data() && t->data + t->nbytes <= all.data() + all.size());
    for (size_t k = 0; k < t->nbytes; ++k) ASSERT_EQ(t->data[k], pattern(i, k)) << k;
  }

  // The raw header: 8-byte aligned data, tensors back to back from 0 to the end of the data, by
  // descending alignment and then by name, as the Python writer orders them.
  const RawSafetensors raw = RawSafetensors::read(path);
  const uint64_t header_len = fs::file_size(path) - 8 - raw.data.size();
  EXPECT_EQ((8 + header_len) % 8, 0u);
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
  for (const auto& [name, entry] : raw.header.items()) {
    ranges.emplace_back(entry["data_offsets"][0].get<uint64_t>(),
                        entry["data_offsets"][1].get<uint64_t>(), name);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t end = 0;
  std::vector<std::string> names;
  for (const auto& [b, e, name] : ranges) {
    EXPECT_EQ(b, end) << name;
    EXPECT_EQ(b % dtype_size(file.find(name)->dtype), 0u) << name;
    end = e;
    names.push_back(name);
  }
  EXPECT_EQ(end, raw.data.size());
  const std::vector<std::string> expected = {"c.i64",  "a.f32",  "e.f32", "empty",   "f.i32",
                                             "A.bf16", "b.bf16", "d.f16", "w.small", "z.bool"};
  EXPECT_EQ(names, expected);  // the zero-size one sorts between its neighbours
  // fill is called in file order.
  std::vector<std::string> filled;
  for (const size_t i : call_order) filled.push_back(entries[i].name);
  EXPECT_EQ(filled, expected);

  // Names must be distinct.
  const std::vector<SafetensorsEntry> twice = {{"x", DType::kF32, {1}}, {"x", DType::kBF16, {1}}};
  expect_error([&] { write_safetensors(path, twice, [](size_t, std::span<std::byte>) {}); },
               {"'x'", "given twice"});
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
  // Listed but absent: no refusal until the tensor is read (transformers picks files by the
  // index and ignores what it does not read), then named with the file the index puts it in.
  const Checkpoint listed = Checkpoint::open(dir.path());
  expect_error([&] { listed.require("w.weight", {3}); },
               {"model-00002-of-00002.safetensors: missing tensor 'w.weight'", "index.json"});

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
