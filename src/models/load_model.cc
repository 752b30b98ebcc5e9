#include "io/checkpoint.h"
#include "models/families.h"
#include "models/model.h"

namespace qhx {

std::unique_ptr<Model> load_model(const std::filesystem::path& dir) {
  const ModelConfig config = load_model_config(dir / "config.json");
  Checkpoint checkpoint = Checkpoint::open(dir);
  switch (config.family) {
    case Family::kQwen3: return load_qwen3(config, std::move(checkpoint));
    case Family::kQwen3_5: return load_qwen3_5(config, std::move(checkpoint));
  }
  return nullptr;
}

}  // namespace qhx
