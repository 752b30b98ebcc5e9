// The compute shaders, compiled from shaders/*.comp to SPIR-V at build time by glslc and
// embedded in the binary (the table is generated: cmake/embed_shaders.cmake).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qhx {

struct ShaderCode {
  const char* name;  // "matmul_w8", "rms_norm", ...
  const uint32_t* code;
  size_t words;
};

// Null when no shader has that name.
const ShaderCode* find_shader(std::string_view name);

}  // namespace qhx
