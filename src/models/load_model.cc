#include "io/bundle.h"
#include "io/checkpoint.h"
#include "io/pack.h"
#include "models/families.h"
#include "models/model.h"

namespace qhx {

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  if (is_pack(dir)) return load_model(select_pack_bundle(dir), options);
  ModelConfig config;
  Checkpoint checkpoint;
  if (is_bundle(dir)) {
    const BundleManifest manifest = open_bundle_manifest(
        dir, {.verify_sha256 = options.verify_sha256, .check_target = options.check_target});
    config = manifest.config;
    checkpoint = open_bundle_tensors(dir, manifest);
  } else {
    config = load_model_config(dir / "config.json");
    checkpoint = Checkpoint::open(dir);
  }
  std::shared_ptr<CpuContext> context = options.context;
  if (context == nullptr) context = std::make_shared<CpuContext>(1, CpuKernels::from_environment());
  switch (config.family) {
    case Family::kQwen3:
      return load_qwen3(config, std::move(checkpoint), std::move(context), options.devices);
    case Family::kQwen3_5:
      return load_qwen3_5(config, std::move(checkpoint), std::move(context), options.devices);
  }
  return nullptr;
}

}  // namespace qhx
