// Shared by every qhx compute shader: storage buffers of 32-bit words only (Vulkan 1.1, no 8- or
// 16-bit storage), and workgroup grids that may exceed 65535 along x (the host splits a count
// into x and y, see vulkan_backend.cc dispatch_grid).
#ifndef QHX_COMMON_GLSL
#define QHX_COMMON_GLSL

// The workgroup's index in a grid of n groups laid out as x·y.
uint flat_group() {
  return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}

// Low or high 16 bits of a word as a float: bf16 is the top half of an f32.
float bf16_at(uint word, uint half_index) {
  const uint bits = half_index == 0u ? (word & 0xFFFFu) : (word >> 16);
  return uintBitsToFloat(bits << 16);
}

float f16_at(uint word, uint half_index) {
  const vec2 both = unpackHalf2x16(word);
  return half_index == 0u ? both.x : both.y;
}

// Signed byte b (0..3) of a word.
int i8_at(uint word, uint b) {
  return bitfieldExtract(int(word), int(8u * b), 8);
}

// Signed nibble n (0..7) of a word: int4 in two's complement.
int i4_at(uint word, uint n) {
  return bitfieldExtract(int(word), int(4u * n), 4);
}

#endif
