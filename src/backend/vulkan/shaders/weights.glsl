// Reading one element of a weight matrix as float32, for the weight type the shader is compiled
// for (WEIGHT_F32, WEIGHT_F16, WEIGHT_BF16, WEIGHT_W8, WEIGHT_W4): the values ref::read_row
// gives (core/tensor.h MatrixRef has the layouts). The including shader declares
//   buffer Weights { uint w[]; };  buffer Scales { uint scales[]; };
// and defines COLS(), GROUP_SIZE() for the matrix.
#ifndef QHX_WEIGHTS_GLSL
#define QHX_WEIGHTS_GLSL

float weight_at(uint row, uint col) {
  const uint i = row * COLS() + col;
#if defined(WEIGHT_F32)
  return uintBitsToFloat(w[i]);
#elif defined(WEIGHT_BF16)
  return bf16_at(w[i >> 1], i & 1u);
#elif defined(WEIGHT_F16)
  return f16_at(w[i >> 1], i & 1u);
#elif defined(WEIGHT_W8)
  return uintBitsToFloat(scales[row]) * float(i8_at(w[i >> 2], i & 3u));
#elif defined(WEIGHT_W4)
  const uint group = row * (COLS() / GROUP_SIZE()) + col / GROUP_SIZE();
  const float scale = f16_at(scales[group >> 1], group & 1u);
  return scale * float(i4_at(w[i >> 3], i & 7u));
#else
#error "compile with one WEIGHT_* definition"
#endif
}

#endif
