#include "io/bundle.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <set>

#include "io/qhxt.h"
#include "util/error.h"
#include "util/sha256.h"

namespace qhx {
namespace {

const char* const kTargets[] = {"generic",       "x86_64",  "x86_64-avx2",
                                "x86_64-avx512", "aarch64", "aarch64-dotprod"};

const Json& object_field(const Json& j, std::string_view key, const std::string& where) {
  const Json& v = require_field(j, key, where);
  if (!v.is_object()) fail(field(where, key), "expected an object");
  return v;
}

// A file name inside the bundle: no directories, no "..", nothing hidden.
std::string local_file(const Json& j, std::string_view key, const std::string& where) {
  const std::string name = require_string(j, key, where);
  if (name.empty() || name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
      name.starts_with(".")) {
    fail(field(where, key), "'" + name + "' is not a file name inside the bundle");
  }
  return name;
}

}  // namespace

bool is_bundle(const std::filesystem::path& dir) {
  return std::filesystem::exists(dir / "manifest.json");
}

BundleManifest parse_bundle_manifest(const Json& j, const std::string& where) {
  if (!j.is_object()) fail(where, "expected a JSON object");
  BundleManifest m;
  m.raw = j;
  if (require_string(j, "format", where) != "qhx-bundle") {
    fail(field(where, "format"), "not a qhx bundle manifest");
  }
  const int64_t version = require_int(j, "format_version", where);
  if (version > kBundleFormatVersion || version < 1) {
    fail(field(where, "format_version"),
         "bundle format version " + std::to_string(version) + " is newer than this qhx reads (" +
             std::to_string(kBundleFormatVersion) + "): upgrade qhx or convert again");
  }
  m.format_version = version;
  m.family = require_string(j, "family", where);
  m.model_config = require_field(j, "model_config", where);
  m.config = parse_model_config(m.model_config, field(where, "model_config"));
  const std::string family_of_config = m.config.family == Family::kQwen3 ? "qwen3" : "qwen3_5";
  if (m.family != family_of_config) {
    fail(field(where, "family"), "'" + m.family + "' but model_config is " + family_of_config);
  }
  m.target = require_string(j, "target", where);
  if (!is_known_target(m.target)) fail(field(where, "target"), "unknown target '" + m.target + "'");

  const Json& plan = object_field(j, "plan", where);
  const std::string pw = field(where, "plan");
  m.embed_file = local_file(object_field(plan, "embed", pw), "file", field(pw, "embed"));
  const Json& shards = require_field(plan, "decoder_shards", pw);
  if (!shards.is_array() || shards.empty()) {
    fail(field(pw, "decoder_shards"), "expected a non-empty array");
  }
  int64_t next_layer = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string sw = field(pw, "decoder_shards[" + std::to_string(i) + "]");
    BundleShard s;
    s.file = local_file(shards[i], "file", sw);
    const Json& layers = require_field(shards[i], "layers", sw);
    if (!layers.is_array() || layers.size() != 2 || !layers[0].is_number_integer() ||
        !layers[1].is_number_integer()) {
      fail(field(sw, "layers"), "expected [first, end)");
    }
    s.first_layer = layers[0].get<int64_t>();
    s.end_layer = layers[1].get<int64_t>();
    if (s.first_layer != next_layer || s.end_layer <= s.first_layer) {
      fail(field(sw, "layers"), "shards must cover the layers in order without gaps");
    }
    next_layer = s.end_layer;
    m.shards.push_back(s);
  }
  if (next_layer != m.config.num_layers) {
    fail(field(pw, "decoder_shards"), "cover " + std::to_string(next_layer) +
                                          " layers, the model has " +
                                          std::to_string(m.config.num_layers));
  }
  m.output_file = local_file(object_field(plan, "output", pw), "file", field(pw, "output"));
  if (auto it = plan.find("vision"); it != plan.end() && !it->is_null()) {
    m.vision_file = local_file(object_field(plan, "vision", pw), "file", field(pw, "vision"));
  }

  const Json& op = object_field(plan, "generate", pw);
  const std::string ow = field(pw, "generate");
  const std::string op_name = require_string(op, "op", ow);
  if (op_name != m.family + "_generate") {
    fail(field(ow, "op"), "'" + op_name + "' does not run a " + m.family + " model");
  }
  const int64_t max_ctx = require_int(op, "max_context", ow);
  if (max_ctx <= 0) fail(field(ow, "max_context"), "must be positive");
  m.config.max_position_embeddings = std::min(m.config.max_position_embeddings, max_ctx);
  m.config.deltanet_chunk = require_int(op, "prefill_chunk", ow);
  if (m.config.deltanet_chunk <= 0 || m.config.deltanet_chunk > 4096) {
    fail(field(ow, "prefill_chunk"), "must be in [1, 4096]");
  }
  if (auto it = op.find("sliding_window"); it != op.end() && !it->is_null()) {
    fail(field(ow, "sliding_window"), "sliding-window attention is not supported");
  }
  const Json& stop_ids = require_field(op, "stop_ids", ow);
  if (!stop_ids.is_array()) fail(field(ow, "stop_ids"), "expected an array");
  for (const Json& id : stop_ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      fail(field(ow, "stop_ids"), "expected token ids");
    }
    m.stop_ids.push_back(id.get<int32_t>());
  }
  if (auto it = op.find("sampling"); it != op.end() && !it->is_object()) {
    fail(field(ow, "sampling"), "expected an object");
  }

  const Json& tok = object_field(j, "tokenizer", where);
  const Json& tok_files = require_field(tok, "files", field(where, "tokenizer"));
  if (!tok_files.is_array()) fail(field(where, "tokenizer.files"), "expected an array");
  for (const Json& f : tok_files) {
    if (!f.is_string()) fail(field(where, "tokenizer.files"), "expected file names");
    m.tokenizer_files.push_back(f.get<std::string>());
  }
  m.precision_policy = object_field(j, "precision_policy", where);
  if (auto it = m.precision_policy.find("activations"); it != m.precision_policy.end()) {
    if (*it != "f32" && *it != "int8") {
      fail(field(where, "precision_policy.activations"), "expected \"f32\" or \"int8\"");
    }
    m.config.int8_activations = *it == "int8";
  }
  if (auto it = m.precision_policy.find("matrices"); it != m.precision_policy.end()) {
    if (!it->is_string()) fail(field(where, "precision_policy.matrices"), "expected a string");
  }

  const Json& files = require_field(j, "files", where);
  if (!files.is_array()) fail(field(where, "files"), "expected an array");
  std::set<std::string> listed;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string fw = field(where, "files[" + std::to_string(i) + "]");
    BundleFile f;
    f.path = local_file(files[i], "path", fw);
    const Json& size = require_field(files[i], "size", fw);
    if (!size.is_number_unsigned()) fail(field(fw, "size"), "expected a byte count");
    f.size = size.get<uint64_t>();
    f.sha256 = require_string(files[i], "sha256", fw);
    if (f.sha256.size() != 64 ||
        f.sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
      fail(field(fw, "sha256"), "expected 64 lowercase hex digits");
    }
    if (!listed.insert(f.path).second) fail(fw, "'" + f.path + "' is listed twice");
    m.files.push_back(f);
  }
  std::vector<std::string> referenced = {m.embed_file, m.output_file};
  for (const auto& s : m.shards) referenced.push_back(s.file);
  if (!m.vision_file.empty()) referenced.push_back(m.vision_file);
  // Each stage of the plan has its own tensor file.
  if (std::set<std::string>(referenced.begin(), referenced.end()).size() != referenced.size()) {
    fail(field(where, "plan"), "embed, decoder shards, output and vision must use distinct files");
  }
  referenced.insert(referenced.end(), m.tokenizer_files.begin(), m.tokenizer_files.end());
  for (const auto& r : referenced) {
    if (!listed.contains(r))
      fail(field(where, "files"), "'" + r + "' is used by the plan but not listed");
  }
  if (auto it = j.find("gate"); it != j.end()) m.gate = *it;
  return m;
}

namespace {

// manifest.json against manifest.sha256 (qhx verify, --verify).
void verify_manifest_hash(const std::filesystem::path& dir) {
  const std::filesystem::path hash_path = dir / kManifestHashFile;
  std::ifstream in(hash_path);
  std::string expected, name;
  if (in >> expected >> name && name.starts_with('*')) name.erase(0, 1);  // sha256sum -b's mark
  if (!in || name != "manifest.json") {
    fail(hash_path.string(),
         "missing or not '<sha256>  manifest.json': manifest.json cannot be checked (convert "
         "again)");
  }
  const std::string actual = sha256_file(dir / "manifest.json");
  if (actual != expected) {
    fail((dir / "manifest.json").string(), "sha256 " + actual + " does not match " +
                                               kManifestHashFile + " (" + expected +
                                               "): the manifest is corrupt or was changed");
  }
}

// Files a bundle's loaders read when they are there: each must be listed (and so checked).
constexpr const char* kReadWhenPresent[] = {"tokenizer.json",      "tokenizer_config.json",
                                            "chat_template.jinja", "generation_config.json",
                                            "draft_vocab.json",    "preprocessor_config.json"};

}  // namespace

BundleManifest open_bundle_manifest(const std::filesystem::path& dir,
                                    const BundleOpenOptions& options) {
  const auto manifest_path = dir / "manifest.json";
  // Checked before it is read, so that a damaged field is named as damage, not as a bad value.
  if (options.verify_sha256 && std::filesystem::exists(dir / kManifestHashFile)) {
    verify_manifest_hash(dir);
  }
  BundleManifest m = parse_bundle_manifest(read_json_file(manifest_path), manifest_path.string());
  if (options.check_target && !target_runs_here(m.target)) {
    fail(manifest_path.string() + ": target", "bundle is built for '" + m.target +
                                                  "' and this machine is '" + host_target() +
                                                  "': convert for this target or use a pack");
  }
  for (const BundleFile& f : m.files) {
    const auto path = dir / f.path;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) fail(path.string(), "missing (listed in manifest.json)");
    if (size != f.size) {
      fail(path.string(), "size " + std::to_string(size) + " bytes, manifest.json says " +
                              std::to_string(f.size) + ": truncated or replaced");
    }
  }
  if (options.verify_sha256) verify_bundle_files(dir, m);
  return m;
}

void verify_bundle_files(const std::filesystem::path& dir, const BundleManifest& m) {
  // From format version 2 every file is covered: the manifest by manifest.sha256, the rest by
  // the manifest's list, so a file a loader would read that is not listed is refused.
  if (m.format_version >= 2) {
    verify_manifest_hash(dir);
    for (const char* name : kReadWhenPresent) {
      const bool listed = std::any_of(m.files.begin(), m.files.end(),
                                      [&](const BundleFile& f) { return f.path == name; });
      if (!listed && std::filesystem::exists(dir / name)) {
        fail((dir / name).string(),
             "not listed in manifest.json, so it cannot be checked, yet qhx would read it "
             "(remove it, or convert again)");
      }
    }
  }
  for (const BundleFile& f : m.files) {
    const std::string actual = sha256_file(dir / f.path);
    if (actual != f.sha256) {
      fail((dir / f.path).string(), "sha256 " + actual + " does not match manifest.json (" +
                                        f.sha256 + "): the file is corrupt or was changed");
    }
  }
}

int64_t layer_of_tensor(const std::string& name) {
  const auto at = name.find("layers.");
  return at == std::string::npos ? -1 : std::atoll(name.c_str() + at + 7);
}

Checkpoint open_bundle_tensors(const std::filesystem::path& dir, const BundleManifest& m) {
  std::vector<std::unique_ptr<TensorFile>> files;
  files.push_back(std::make_unique<QhxtFile>(QhxtFile::open(dir / m.embed_file)));
  for (const BundleShard& s : m.shards) {
    auto shard = std::make_unique<QhxtFile>(QhxtFile::open(dir / s.file));
    // A shard holds its own layers' tensors and nothing else.
    for (const auto& [name, view] : shard->tensors()) {
      const int64_t layer = layer_of_tensor(name);
      if (layer < s.first_layer || layer >= s.end_layer) {
        fail(shard->path().string(), "tensor '" + name + "' is outside the shard's layers [" +
                                         std::to_string(s.first_layer) + ", " +
                                         std::to_string(s.end_layer) + ")");
      }
    }
    files.push_back(std::move(shard));
  }
  files.push_back(std::make_unique<QhxtFile>(QhxtFile::open(dir / m.output_file)));
  if (!m.vision_file.empty()) {
    auto vision = std::make_unique<QhxtFile>(QhxtFile::open(dir / m.vision_file));
    for (const auto& [name, view] : vision->tensors()) {
      if (!name.starts_with("model.visual.")) {
        fail(vision->path().string(), "tensor '" + name + "' is not the vision tower's");
      }
    }
    files.push_back(std::move(vision));
  }
  return Checkpoint::from_files(dir, std::move(files));
}

bool is_known_target(const std::string& target) {
  for (const char* t : kTargets) {
    if (target == t) return true;
  }
  return false;
}

std::string host_target() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return "x86_64-avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "x86_64-avx2";
  return "x86_64";
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_DOTPROD)
  return "aarch64-dotprod";
#else
  return "aarch64";
#endif
#else
  return "generic";
#endif
}

bool target_runs_here(const std::string& target) {
  if (target == "generic") return true;
  const std::string host = host_target();
  if (target == host) return true;
  if (host == "x86_64-avx512") return target == "x86_64" || target == "x86_64-avx2";
  if (host == "x86_64-avx2") return target == "x86_64";
  if (host == "aarch64-dotprod") return target == "aarch64";
  return false;
}

}  // namespace qhx
