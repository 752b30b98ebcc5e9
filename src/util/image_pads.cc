#include "util/image_pads.h"

#include <algorithm>

#include "util/error.h"

namespace qhx {

std::vector<int32_t> expand_image_pads(std::span<const int32_t> ids, int32_t pad,
                                       std::span<const std::vector<int32_t>> images,
                                       const std::string& where) {
  const auto pads = static_cast<size_t>(std::count(ids.begin(), ids.end(), pad));
  if (pads != images.size()) {
    fail(where, std::to_string(images.size()) + " images for " + std::to_string(pads) +
                    " <|image_pad|> tokens (id " + std::to_string(pad) +
                    "): one image per placeholder");
  }
  std::vector<int32_t> out;
  size_t next = 0;
  for (const int32_t id : ids) {
    if (id != pad) {
      out.push_back(id);
    } else {
      out.insert(out.end(), images[next].begin(), images[next].end());
      ++next;
    }
  }
  return out;
}

}  // namespace qhx
