// qhx bundles (docs/bundle.md): a directory with manifest.json — the declarative run plan —
// beside the tensor files (.qhxt) and tokenizer files it names, each with size and sha256.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "util/json_file.h"

namespace qhx {

// 2: manifest.sha256 protects manifest.json, and the files list holds the model card too.
inline constexpr int64_t kBundleFormatVersion = 2;
// "<sha256 of manifest.json>  manifest.json\n", as sha256sum writes it (sha256sum -c reads it).
inline constexpr const char* kManifestHashFile = "manifest.sha256";

struct BundleFile {
  std::string path;  // relative to the bundle directory
  uint64_t size = 0;
  std::string sha256;
};

struct BundleShard {
  std::string file;
  int64_t first_layer = 0;  // [first_layer, end_layer)
  int64_t end_layer = 0;
};

// What the manifest says, checked for consistency (every referenced file is listed, shards
// cover the layers in order, the model config parses).
struct BundleManifest {
  int64_t format_version = 0;
  std::string family;
  Json model_config;   // the checkpoint's config.json, verbatim
  ModelConfig config;  // parsed, with the plan's max context and prefill chunk applied
  std::string target;
  std::string embed_file;
  std::vector<BundleShard> shards;
  std::string output_file;  // final norm and (unless tied) lm_head
  std::string vision_file;  // the vision tower (model.visual.*); "" in a text model's bundle
  std::vector<std::string> tokenizer_files;
  std::vector<int32_t> stop_ids;  // the generate host-op's (sampling: generation_config.json)
  Json precision_policy;
  std::vector<BundleFile> files;
  Json gate;  // the oracle gate certificate, null when the bundle was not gated
  Json raw;   // the whole manifest
};

bool is_bundle(const std::filesystem::path& dir);
BundleManifest parse_bundle_manifest(const Json& manifest, const std::string& where);

struct BundleOpenOptions {
  bool verify_sha256 = false;  // sizes are always checked
  bool check_target = true;
};

// Reads and checks manifest.json and the files it lists (existence, size, optionally sha256),
// and that the bundle's target runs on this machine.
BundleManifest open_bundle_manifest(const std::filesystem::path& dir,
                                    const BundleOpenOptions& options);
// Checks every listed file's sha256; throws Error naming the first file that differs.
void verify_bundle_files(const std::filesystem::path& dir, const BundleManifest& manifest);
// Index of the decoder layer a tensor belongs to ("model.layers.7.mlp..." → 7), or -1.
int64_t layer_of_tensor(const std::string& name);
// Maps the bundle's tensor files as one Checkpoint.
Checkpoint open_bundle_tensors(const std::filesystem::path& dir, const BundleManifest& manifest);

// Targets name the least capable CPU a bundle is built for: "generic", "x86_64",
// "x86_64-avx2", "x86_64-avx512", "aarch64", "aarch64-dotprod".
std::string host_target();  // the most capable target this machine runs
bool target_runs_here(const std::string& target);
bool is_known_target(const std::string& target);

}  // namespace qhx
