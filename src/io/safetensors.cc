#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference's MAX_HEADER_SIZE

// The rank of a dtype in the reference's `Dtype` enum, which lists dtypes in increasing
// alignment; its writer lays tensors out by descending rank, then by name.
int reference_rank(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 2;
    case DType::kI16:
      return 3;
    case DType::kF16:
      return 4;
    case DType::kBF16:
      return 5;
    case DType::kI32:
      return 6;
    case DType::kF32:
      return 7;
    case DType::kF64:
      return 8;
    case DType::kI64:
      return 9;
    case DType::kU16:
    case DType::kU32:
    case DType::kU64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
    case DType::kC64:
    case DType::kW8:
    case DType::kW4:
      break;  // read, never written
  }
  return -1;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path, MappedFile file)
    : TensorFile(path, std::move(file)) {}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile st(path, MappedFile(path));
  const std::string where = path.string();
  const auto bytes = st.file_.bytes();
  if (bytes.size() < 8) fail(where, "truncated: shorter than the 8-byte header length");
  const uint64_t header_len = read_le64(bytes.data());
  if (header_len > kMaxHeaderBytes) {
    fail(where, "header length " + std::to_string(header_len) + " is implausibly large");
  }
  if (header_len > bytes.size() - 8) {
    fail(where, "truncated: header needs " + std::to_string(header_len) + " bytes, file has " +
                    std::to_string(bytes.size() - 8));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
  if (header.empty()) fail(where, "header is empty (it must be a JSON object)");
  // A name given twice (a damaged header: a flipped bit made one tensor's name another's).
  const Json json = parse_json(header, where + ": header", /*unique_keys=*/true);
  if (!json.is_object()) fail(where, "header is not a JSON object");

  const std::byte* data_start = bytes.data() + 8 + header_len;
  const uint64_t data_size = bytes.size() - 8 - header_len;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(where, "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(where + ": __metadata__." + k, "expected a string");
        st.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string tensor_where = where + ": tensor '" + name + "'";
    TensorView view;
    view.name = name;
    view.file = st.path_.get();
    const std::string dtype_str = require_string(entry, "dtype", tensor_where);
    const auto dtype = dtype_from_safetensors_name(dtype_str);
    if (!dtype) fail(tensor_where + ": dtype", "unsupported dtype '" + dtype_str + "'");
    view.dtype = *dtype;

    const Json& shape = require_field(entry, "shape", tensor_where);
    if (!shape.is_array()) fail(tensor_where + ": shape", "expected an array");
    uint64_t numel = 1;
    for (const Json& d : shape) {
      if (!d.is_number_unsigned()) fail(tensor_where + ": shape", "expected non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / dim) {
        fail(tensor_where + ": shape", "too large");
      }
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }

    const Json& offsets = require_field(entry, "data_offsets", tensor_where);
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(tensor_where + ": data_offsets", "expected [begin, end]");
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end) fail(tensor_where + ": data_offsets", "begin is past end");
    if (end > data_size) {
      fail(tensor_where + ": data_offsets",
           "end " + std::to_string(end) + " is past the end of the data (" +
               std::to_string(data_size) + " bytes): file truncated or header corrupt");
    }
    const uint64_t expected = numel * dtype_size(view.dtype);
    if (end - begin != expected) {
      fail(tensor_where + ": data_offsets", "byte range holds " + std::to_string(end - begin) +
                                                " bytes but shape " + view.shape_string() + " of " +
                                                dtype_str + " needs " + std::to_string(expected));
    }
    ranges.push_back({begin, end, name});
    view.nbytes = expected;
    view.data = data_start + begin;
    view.buffer = st.mapped_.get();
    const size_t align = dtype_size(view.dtype);
    if (reinterpret_cast<uintptr_t>(view.data) % align != 0) {
      auto copy = std::make_unique<std::byte[]>(view.nbytes);
      std::memcpy(copy.get(), view.data, view.nbytes);
      view.data = copy.get();
      view.buffer = nullptr;
      st.realigned_.push_back(std::move(copy));
    }
    st.tensors_.emplace(name, std::move(view));
  }

  // The tensors must tile the data exactly, as the reference's Metadata::validate requires:
  // sorted by byte range, each begins where the previous ends (the first at 0) and the last
  // ends where the data does. Zero-size tensors fit anywhere in that sequence.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t previous_end = 0;
  const std::string* previous = nullptr;
  for (const Range& r : ranges) {
    const std::string tensor_where = where + ": tensor '" + r.name + "': data_offsets";
    const std::string after =
        previous ? "the previous tensor '" + *previous + "' ends at " + std::to_string(previous_end)
                 : "the data starts at 0";
    if (r.begin > previous_end) {
      fail(tensor_where,
           "begins at " + std::to_string(r.begin) + " but " + after + " (a hole of " +
               std::to_string(r.begin - previous_end) +
               " bytes; safetensors files have none: a checkpoint from an older qhx forge "
               "synth must be written again)");
    }
    if (r.begin < previous_end) {
      fail(tensor_where, "begins at " + std::to_string(r.begin) +
                             " and overlaps the previous tensor '" + *previous +
                             "' (which ends at " + std::to_string(previous_end) + ")");
    }
    previous_end = r.end;
    previous = &r.name;
  }
  if (previous_end != data_size) {
    fail(where, std::to_string(data_size - previous_end) +
                    (previous ? " bytes after the last tensor's end (the data must end where the "
                                "last tensor does)"
                              : " bytes of data but the header lists no tensors (the data must "
                                "hold the tensors and nothing else)"));
  }
  return st;
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::function<void(size_t, std::span<std::byte>)>& fill) {
  // The reference writer's layout: by descending dtype alignment, then by name, back to back.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ra = reference_rank(tensors[a].dtype), rb = reference_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });
  // The header lists the tensors in file order, as the reference writer does.
  std::string text = "{";
  std::set<std::string_view> names;
  std::vector<uint64_t> sizes(tensors.size());
  uint64_t offset = 0;
  for (const size_t i : order) {
    const SafetensorsEntry& t = tensors[i];
    const std::string where = path.string() + ": tensor '" + t.name + "'";
    if (t.name == "__metadata__") fail(where, "the name is reserved for the metadata");
    if (!names.insert(t.name).second) fail(where, "given twice");
    if (reference_rank(t.dtype) < 0) {
      fail(where, "dtype " + std::string(dtype_name(t.dtype)) + " has no safetensors name");
    }
    uint64_t numel = 1;
    for (const int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    sizes[i] = numel * dtype_size(t.dtype);
    const nlohmann::ordered_json entry = {{"dtype", dtype_name(t.dtype)},
                                          {"shape", t.shape},
                                          {"data_offsets", {offset, offset + sizes[i]}}};
    if (text.size() > 1) text += ',';
    text += Json(t.name).dump() + ":" + entry.dump();
    offset += sizes[i];
  }
  text += '}';
  // Pad the header with spaces so that the data (8 + header bytes in) starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path.string(), "cannot create");
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out << text;
  std::vector<std::byte> buffer;
  for (const size_t i : order) {
    buffer.assign(sizes[i], std::byte{0});
    fill(i, buffer);
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(sizes[i]));
  }
  out.flush();
  if (!out) fail(path.string(), "write failed (disk full?)");
}

}  // namespace qhx
