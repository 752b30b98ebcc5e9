// The processor's expansion of a prompt's image placeholders into the images' tokens, shared by
// every interface that takes images (C API, server, CLI, gate) and by none of their model code.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qhx {

// Each `pad` (<|image_pad|>) of `ids`, in order, replaced by the ids of the image it stands for.
// Throws Error naming `where` when the prompt's pads and the images differ in number.
std::vector<int32_t> expand_image_pads(std::span<const int32_t> ids, int32_t pad,
                                       std::span<const std::vector<int32_t>> images,
                                       const std::string& where);

}  // namespace qhx
