// The W8/W4 matmul with int8 activations (the arithmetic ref::matmul defines for a matrix where
// uses_int8_activations(w)), on the fastest integer kernels this CPU runs. kernels/matmul.h's
// matmul() dispatches here; it is separate so each can be tested against the reference.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/kernels.h"

namespace qhx {

class CpuContext;
struct CpuKernels;

// Requires uses_int8_activations(w). x: [n_tokens, w.cols]; y: [n_tokens, w.rows].
void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y);

// True when the matrices can share one quantization of their input: each uses int8
// activations, and all have one dtype, one column count and the same packing.
bool share_int8_activations(std::span<const MatmulOutput> outputs);
// matmul_int8 for each output, x quantized once and all rows one job for the threads. Requires
// share_int8_activations(outputs).
void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens,
                 std::span<const MatmulOutput> outputs);

// A W8 or W4 matrix repacked for this CPU's int8 kernels (AVX-512 VNNI: rows in panels of 16,
// interleaved 4 (W8) or 8 (W4) columns at a time, so one multiply-add serves 16 rows and a
// block's integer sums are scaled once; W4 group scales ride along). Empty (data() null) when the
// kernels read the matrix as it lies. Set MatrixRef::packed to data() to use it; the MatrixRef's
// own data stays the reference.
class PackedMatrix {
 public:
  const void* data() const { return bytes_.get(); }

 private:
  struct Unmap {
    size_t size;
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Unmap> bytes_;
  friend PackedMatrix pack_for_int8_kernels(const CpuKernels& kernels, const MatrixRef& w);
};
// True when these int8 kernels have a layout of their own for w.
bool packs_for_int8_kernels(const CpuKernels& kernels, const MatrixRef& w);
// Empty unless packs_for_int8_kernels(kernels, w). Throws Error (kOutOfMemory) naming the matrix
// when there is no memory for the copy. The packing is the CPU backend's weight preparation: a
// context that runs other kernels reads the matrix as it lies.
PackedMatrix pack_for_int8_kernels(const CpuKernels& kernels, const MatrixRef& w);

// ref::read_row (the same float32 values), from w.packed when set: a matrix whose mapped pages
// were released after packing (its values, and W4 group scales) is read from its packed copy
// (embedding lookups of a tied table). W8 row scales are read where they lie. Works in the
// caller's scratch of cx.
void read_row(CpuContext& cx, const MatrixRef& w, int64_t row, float* out);

}  // namespace qhx
