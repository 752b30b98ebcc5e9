// The model card written beside a bundle's manifest: card.json (data) and README.md rendered
// from it, in the manner of the seeds' cards: files, sizes, sha256, quantization, gate results,
// and measured figures once `qhx bench` has added them.
#pragma once

#include <filesystem>

#include "util/json_file.h"

namespace qhx {

Json model_card_data(const Json& manifest);
std::string render_model_card(const Json& card);
// Writes card.json and README.md into `bundle_dir`.
void write_model_card(const std::filesystem::path& bundle_dir, const Json& manifest);

}  // namespace qhx
