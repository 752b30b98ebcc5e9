#include "support/raw_safetensors.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "support/fixtures.h"

namespace qhx::test {

RawSafetensors RawSafetensors::read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  if (bytes.size() < 8) throw std::runtime_error("short safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  RawSafetensors raw;
  raw.header = Json::parse(bytes.substr(8, n));
  raw.data = bytes.substr(8 + n);
  return raw;
}

void RawSafetensors::add(const std::string& name, const std::string& dtype,
                         std::vector<int64_t> shape, const void* bytes, size_t nbytes) {
  const size_t begin = data.size();
  data.append(static_cast<const char*>(bytes), nbytes);
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
}

void RawSafetensors::erase(const std::string& name) {
  const Json offsets = header.at(name).at("data_offsets");
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  header.erase(name);
  data.erase(begin, end - begin);
  for (auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    Json& o = entry["data_offsets"];
    for (int k = 0; k < 2; ++k) {
      if (o[k].get<uint64_t>() >= end) o[k] = o[k].get<uint64_t>() - (end - begin);
    }
  }
}

void RawSafetensors::write(const std::filesystem::path& path, size_t align) const {
  std::string text = header.dump();
  while ((8 + text.size()) % align != 0) text += ' ';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  out << text << data;
}

void copy_dir(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::create_directories(to);
  std::filesystem::copy(
      from, to,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  for (const auto& e : std::filesystem::recursive_directory_iterator(to)) {
    std::filesystem::permissions(e.path(), std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::add);
  }
}

void copy_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to,
                     const std::function<bool(const std::string&)>& drop,
                     const std::vector<NewTensor>& add) {
  namespace fs = std::filesystem;
  copy_dir(from, to);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(to)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("model") && name.ends_with(".safetensors")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw std::runtime_error("no weight file in " + from.string());
  const fs::path index_path = to / "model.safetensors.index.json";
  Json index = fs::exists(index_path) ? Json::parse(std::ifstream(index_path)) : Json();
  for (size_t f = 0; f < files.size(); ++f) {
    RawSafetensors raw = RawSafetensors::read(files[f]);
    std::vector<std::string> names;
    for (const auto& [name, entry] : raw.header.items()) {
      if (name != "__metadata__" && drop(name)) names.push_back(name);
    }
    for (const std::string& name : names) {
      raw.erase(name);
      if (!index.is_null()) index["weight_map"].erase(name);
    }
    for (size_t i = 0; f == 0 && i < add.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : add[i].shape) n *= d;
      const std::vector<float> values = random_vector(n, static_cast<uint32_t>(i) + 1, 0.02f);
      raw.add(add[i].name, "F32", add[i].shape, values.data(), values.size() * sizeof(float));
      if (!index.is_null()) index["weight_map"][add[i].name] = files[f].filename().string();
    }
    raw.write(files[f]);
  }
  if (!index.is_null()) std::ofstream(index_path) << index.dump(2);
}

}  // namespace qhx::test
