// Reading one element of a weight matrix as float32, for the weight type the shader is compiled
// for (WEIGHT_F32, WEIGHT_F16, WEIGHT_BF16, WEIGHT_W8, WEIGHT_W4): the values ref::read_row
// gives (core/tensor.h MatrixRef has the layouts). The including shader declares
//   buffer Weights { uint w[]; };  buffer Scales { uint scales[]; };
// and defines COLS(), GROUP_SIZE() for the matrix and W_BASE(), S_BASE(): the words of w and
// scales before the matrix's first (a matrix used in place in a mapped file starts where the
// file has it, not at the start of a buffer).
#ifndef QHX_WEIGHTS_GLSL
#define QHX_WEIGHTS_GLSL

float weight_at(uint row, uint col) {
  const uint i = row * COLS() + col;
#if defined(WEIGHT_F32)
  return uintBitsToFloat(w[W_BASE() + i]);
#elif defined(WEIGHT_BF16)
  return bf16_at(w[W_BASE() + (i >> 1)], i & 1u);
#elif defined(WEIGHT_F16)
  return f16_at(w[W_BASE() + (i >> 1)], i & 1u);
#elif defined(WEIGHT_W8)
  return uintBitsToFloat(scales[S_BASE() + row]) * float(i8_at(w[W_BASE() + (i >> 2)], i & 3u));
#elif defined(WEIGHT_W4)
  const uint group = row * (COLS() / GROUP_SIZE()) + col / GROUP_SIZE();
  const float scale = f16_at(scales[S_BASE() + (group >> 1)], group & 1u);
  return scale * float(i4_at(w[W_BASE() + (i >> 3)], i & 7u));
#else
#error "compile with one WEIGHT_* definition"
#endif
}

#endif
