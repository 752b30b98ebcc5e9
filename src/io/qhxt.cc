#include "io/qhxt.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/dtype.h"
#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

constexpr char kMagic[4] = {'Q', 'H', 'X', 'T'};
constexpr uint64_t kMaxTableBytes = 64u << 20;

uint64_t read_le(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void write_le(std::ostream& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.put(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t align_up(uint64_t x) {
  return (x + kQhxtAlignment - 1) / kQhxtAlignment * kQhxtAlignment;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kW8, DType::kW4, DType::kI32}) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

// A checked [offset, offset + bytes) range inside the data area.
struct Range {
  uint64_t begin, end;
};

Range checked_range(const Json& entry, std::string_view key_offset, uint64_t bytes,
                    uint64_t file_size, const std::string& where) {
  const Json& off = require_field(entry, key_offset, where);
  if (!off.is_number_unsigned()) fail(where + ": " + std::string(key_offset), "expected an offset");
  const uint64_t begin = off.get<uint64_t>();
  if (begin % kQhxtAlignment != 0) {
    fail(where + ": " + std::string(key_offset),
         "offset " + std::to_string(begin) + " is not 64-byte aligned");
  }
  if (begin > file_size || bytes > file_size - begin) {
    fail(where + ": " + std::string(key_offset),
         "bytes [" + std::to_string(begin) + ", " + std::to_string(begin + bytes) +
             ") run past the end of the file (" + std::to_string(file_size) +
             " bytes): truncated or corrupt");
  }
  return {begin, begin + bytes};
}

}  // namespace

TensorBytes tensor_bytes(DType dtype, std::span<const int64_t> shape, int64_t group_size,
                         const std::string& where) {
  if (shape.empty()) fail(where + ": shape", "expected at least one dimension");
  if (is_quantized(dtype) && shape.size() != 2) {
    fail(where + ": shape", "a quantized tensor must be a matrix");
  }
  // Plain tensors are laid out as [shape[0], product of the rest].
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) {
    if (shape[i] < 0 || (shape[i] > 0 && cols > (int64_t{1} << 48) / shape[i])) {
      fail(where + ": shape", "invalid or too large");
    }
    cols *= shape[i];
  }
  try {
    return {matrix_bytes(dtype, shape[0], cols, group_size),
            matrix_scale_bytes(dtype, shape[0], cols, group_size)};
  } catch (const Error& e) {
    fail(where, e.what());
  }
}

QhxtFile QhxtFile::open(const std::filesystem::path& path) {
  QhxtFile f(path, MappedFile(path));
  const std::string where = path.string();
  const auto bytes = f.file_.bytes();
  if (bytes.size() < 16) fail(where, "truncated: shorter than the 16-byte header");
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) fail(where, "not a qhx tensor file (bad magic)");
  const uint64_t version = read_le(bytes.data() + 4, 4);
  if (version != kQhxtVersion) {
    fail(where, "tensor file format version " + std::to_string(version) + ", this qhx reads " +
                    std::to_string(kQhxtVersion));
  }
  const uint64_t table_len = read_le(bytes.data() + 8, 8);
  if (table_len > kMaxTableBytes || table_len > bytes.size() - 16) {
    fail(where, "truncated: the tensor table needs " + std::to_string(table_len) + " bytes");
  }
  const Json table =
      parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data() + 16), table_len),
                 where + ": tensor table");
  const Json& tensors = require_field(table, "tensors", where + ": tensor table");
  if (!tensors.is_array()) fail(where + ": tensors", "expected an array");
  if (const auto metadata = table.find("metadata"); metadata != table.end()) {
    if (!metadata->is_object()) fail(where + ": metadata", "expected an object of strings");
    for (const auto& [key, value] : metadata->items()) {
      if (!value.is_string()) fail(where + ": metadata." + key, "expected a string");
      f.metadata_.emplace(key, value.get<std::string>());
    }
  }

  const uint64_t data_start = 16 + table_len;
  std::vector<Range> used;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Json& entry = tensors[i];
    const std::string name =
        require_string(entry, "name", where + ": tensors[" + std::to_string(i) + "]");
    const std::string tw = where + ": tensor '" + name + "'";
    TensorView view;
    view.name = name;
    view.file = f.path_.get();
    const std::string dtype = require_string(entry, "dtype", tw);
    const auto parsed = dtype_from_name(dtype);
    if (!parsed) fail(tw + ": dtype", "unsupported dtype '" + dtype + "'");
    view.dtype = *parsed;
    const Json& shape = require_field(entry, "shape", tw);
    if (!shape.is_array() || shape.empty()) fail(tw + ": shape", "expected a non-empty array");
    for (const Json& d : shape) {
      if (!d.is_number_unsigned()) fail(tw + ": shape", "expected non-negative integers");
      view.shape.push_back(d.get<int64_t>());
    }
    if (view.dtype == DType::kW4) view.group_size = require_int(entry, "group_size", tw);
    const TensorBytes sizes = tensor_bytes(view.dtype, view.shape, view.group_size, tw);
    view.nbytes = sizes.data;
    if (require_int(entry, "nbytes", tw) != static_cast<int64_t>(view.nbytes)) {
      fail(tw + ": nbytes",
           "does not match the dtype and shape (" + std::to_string(view.nbytes) + " bytes)");
    }
    const Range data = checked_range(entry, "offset", view.nbytes, bytes.size(), tw);
    if (data.begin < data_start) fail(tw + ": offset", "points into the tensor table");
    view.data = bytes.data() + data.begin;
    view.buffer = f.mapped_.get();
    used.push_back(data);
    if (const uint64_t sb = sizes.scales) {
      const Range scales = checked_range(entry, "scales_offset", sb, bytes.size(), tw);
      if (scales.begin < data_start) fail(tw + ": scales_offset", "points into the tensor table");
      view.scales = bytes.data() + scales.begin;
      view.scale_bytes = sb;
      used.push_back(scales);
    }
    if (!f.tensors_.emplace(name, std::move(view)).second) fail(tw, "listed twice");
  }
  std::sort(used.begin(), used.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < used.size(); ++i) {
    if (used[i].begin < used[i - 1].end) fail(where, "tensor table has overlapping byte ranges");
  }
  return f;
}

void write_qhxt(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                const std::map<std::string, std::string>& metadata) {
  // Lay out the data first so the table can give final offsets; the table's own length moves
  // the data start, so iterate until the padded table length is stable.
  Json table = {{"tensors", Json::array()}};
  if (!metadata.empty()) table["metadata"] = metadata;
  uint64_t data_start = 0;
  std::string text;
  for (int pass = 0; pass < 4; ++pass) {
    table["tensors"] = Json::array();
    uint64_t offset = data_start;
    for (const TensorToWrite& t : tensors) {
      Json entry = {{"name", t.name},
                    {"dtype", dtype_name(t.dtype)},
                    {"shape", t.shape},
                    {"offset", offset},
                    {"nbytes", t.data.size()}};
      offset = align_up(offset + t.data.size());
      if (!t.scales.empty()) {
        entry["scales_offset"] = offset;
        offset = align_up(offset + t.scales.size());
      }
      if (t.dtype == DType::kW4) entry["group_size"] = t.group_size;
      table["tensors"].push_back(std::move(entry));
    }
    text = table.dump();
    const uint64_t needed = align_up(16 + text.size());
    if (needed == data_start) break;
    data_start = needed;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path.string(), "cannot create");
  out.write(kMagic, 4);
  write_le(out, kQhxtVersion, 4);
  write_le(out, text.size(), 8);
  out << text;
  uint64_t position = 16 + text.size();
  const auto pad_to = [&](uint64_t target) {
    for (; position < target; ++position) out.put('\0');
  };
  pad_to(data_start);
  for (const TensorToWrite& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size()));
    position += t.data.size();
    pad_to(align_up(position));
    if (!t.scales.empty()) {
      out.write(reinterpret_cast<const char*>(t.scales.data()),
                static_cast<std::streamsize>(t.scales.size()));
      position += t.scales.size();
      pad_to(align_up(position));
    }
  }
  out.flush();
  if (!out) fail(path.string(), "write failed (disk full?)");
}

}  // namespace qhx
