// The fast gated delta rule: float32 with AVX2 + FMA where the CPU has it (otherwise, or with
// QHX_KERNELS=reference, the scalar references), on the threads of a CPU context
// (kernels/cpu_context.h). Both have the arguments and meaning of their ref:: namesakes in
// kernels/kernels.h, and give the same bits on any number of threads.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace qhx {

class CpuContext;

// Token by token (decode). Each column of a value head's state is a recurrence of its own, so
// blocks of columns of every head are the parallel tasks.
void gated_delta_rule_recurrent(CpuContext& cx, const float* q, const float* k, const float* v,
                                const float* beta, const float* g, int64_t n_tokens,
                                const DeltaRuleShape& shape, float* state, float* out);

// In chunks of `chunk` tokens (WY form, spec §3.7 step 7'; prefill), one value head per task,
// each chunk a few small matrix products.
void gated_delta_rule_chunked(CpuContext& cx, const float* q, const float* k, const float* v,
                              const float* beta, const float* g, int64_t n_tokens,
                              const DeltaRuleShape& shape, int64_t chunk, float* state, float* out);

}  // namespace qhx
