#include "backend/cpu_backend.h"
#include "io/bundle.h"
#include "io/checkpoint.h"
#include "io/draft_vocab.h"
#include "io/pack.h"
#include "models/families.h"
#include "models/model.h"
#include "models/weights.h"
#include "util/error.h"

namespace qhx {
namespace {

std::vector<int32_t> mtp_vocab(const std::filesystem::path& dir, const ModelConfig& config,
                               int64_t size) {
  const std::filesystem::path file = dir / kDraftVocabFile;
  if (size == LoadOptions::kFullVocabulary || !std::filesystem::exists(file)) return {};
  std::vector<int32_t> ids = read_draft_vocab(file, config.vocab_size);
  if (size > 0 && size < static_cast<int64_t>(ids.size())) ids.resize(size);
  return ids;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, Checkpoint checkpoint,
                                  const LoadOptions& options) {
  if (options.mtp_vocab_size < LoadOptions::kFullVocabulary) {
    fail("mtp_vocab_size", "expected a token count, 0 (all) or -1 (every token)");
  }
  const std::filesystem::path dir = checkpoint.dir();
  std::shared_ptr<CpuContext> context = options.context;
  if (context == nullptr) context = std::make_shared<CpuContext>(1, CpuKernels::from_environment());
  std::vector<std::shared_ptr<Backend>> backends = {std::make_shared<CpuBackend>(*context)};
  backends.insert(backends.end(), options.devices.begin(), options.devices.end());
  switch (config.family) {
    case Family::kQwen3:
      return load_qwen3(config, std::move(checkpoint), std::move(context), std::move(backends),
                        options.kv_type);
    case Family::kQwen3_5:
      return load_qwen3_5(config, std::move(checkpoint), std::move(context), std::move(backends),
                          options.kv_type,
                          [&] { return mtp_vocab(dir, config, options.mtp_vocab_size); });
  }
  return nullptr;
}

std::unique_ptr<Model> make_checkpoint_model(const ModelConfig& config, Checkpoint checkpoint,
                                             const LoadOptions& options) {
  check_sizes_against_weights(config, checkpoint, (checkpoint.dir() / "config.json").string());
  return make_model(config, std::move(checkpoint), options);
}

}  // namespace

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  if (is_pack(dir)) return load_model(select_pack_bundle(dir), options);
  if (!is_bundle(dir)) {
    // config.json first: a directory that is no checkpoint is named by the file that says so.
    const ModelConfig config = load_model_config(dir / "config.json");
    return make_checkpoint_model(config, Checkpoint::open(dir), options);
  }
  const BundleManifest manifest = open_bundle_manifest(
      dir, {.verify_sha256 = options.verify_sha256, .check_target = options.check_target});
  Checkpoint checkpoint = open_bundle_tensors(dir, manifest);
  check_sizes_against_weights(manifest.config, checkpoint,
                              (dir / "manifest.json").string() + ": model_config");
  return make_model(manifest.config, std::move(checkpoint), options);
}

std::unique_ptr<Model> load_model(Checkpoint checkpoint, const LoadOptions& options) {
  const std::filesystem::path dir = checkpoint.dir();
  return make_checkpoint_model(load_model_config(dir / "config.json"), std::move(checkpoint),
                               options);
}

}  // namespace qhx
