#include "io/safetensors.h"

#include <cstring>
#include <fstream>
#include <limits>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // same bound as the reference implementation

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
  const Json json = parse_json(header, where + ": header");
  if (!json.is_object()) fail(where, "header is not a JSON object");

  const std::byte* data_start = bytes.data() + 8 + header_len;
  const uint64_t data_size = bytes.size() - 8 - header_len;
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
    view.nbytes = expected;
    view.data = data_start + begin;
    const size_t align = dtype_size(view.dtype);
    if (reinterpret_cast<uintptr_t>(view.data) % align != 0) {
      auto copy = std::make_unique<std::byte[]>(view.nbytes);
      std::memcpy(copy.get(), view.data, view.nbytes);
      view.data = copy.get();
      st.realigned_.push_back(std::move(copy));
    }
    st.tensors_.emplace(name, std::move(view));
  }
  return st;
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::function<void(size_t, std::span<std::byte>)>& fill) {
  constexpr uint64_t kAlign = 64;
  Json header = Json::object();
  std::vector<uint64_t> begins, sizes;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    uint64_t numel = 1;
    for (const int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t size = numel * dtype_size(t.dtype);
    begins.push_back(offset);
    sizes.push_back(size);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    offset = (offset + size + kAlign - 1) / kAlign * kAlign;
  }
  std::string text = header.dump();
  // Pad the header with spaces so that the data (8 + header bytes in) starts 64-byte aligned.
  text.append((kAlign - (8 + text.size()) % kAlign) % kAlign, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path.string(), "cannot create");
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out << text;
  std::vector<std::byte> buffer;
  uint64_t written = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string padding(begins[i] - written, '\0');
    out.write(padding.data(), static_cast<std::streamsize>(padding.size()));
    buffer.assign(sizes[i], std::byte{0});
    fill(i, buffer);
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(sizes[i]));
    written = begins[i] + sizes[i];
  }
  out.flush();
  if (!out) fail(path.string(), "write failed (disk full?)");
}

}  // namespace qhx
