// A sum or a maximum over the 64 threads of a workgroup, the result in every thread. With
// SUBGROUP defined (devices whose subgroups do arithmetic in compute shaders): within each
// subgroup first, then across the few subgroups; otherwise a tree in shared memory. Every thread
// of the workgroup must call them, in the same order. Include before any other declaration: the
// subgroup extension must come first.
#ifndef QHX_REDUCE_GLSL
#define QHX_REDUCE_GLSL
#if defined(SUBGROUP)
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

shared float reduce_slots[64];

#if defined(SUBGROUP)
#define QHX_REDUCE(name, subgroup_op, combine)                    \
  float name(float x) {                                           \
    const float part = subgroup_op(x);                            \
    if (subgroupElect()) reduce_slots[gl_SubgroupID] = part;      \
    barrier();                                                    \
    float result = reduce_slots[0];                               \
    for (uint i = 1; i < gl_NumSubgroups; ++i) result = combine(result, reduce_slots[i]); \
    barrier();                                                    \
    return result;                                                \
  }
#else
#define QHX_REDUCE(name, subgroup_op, combine)                                   \
  float name(float x) {                                                          \
    const uint lane = gl_LocalInvocationID.x;                                    \
    reduce_slots[lane] = x;                                                      \
    barrier();                                                                   \
    for (uint w = 32; w > 0; w >>= 1) {                                          \
      if (lane < w) reduce_slots[lane] = combine(reduce_slots[lane], reduce_slots[lane + w]); \
      barrier();                                                                 \
    }                                                                            \
    const float result = reduce_slots[0];                                        \
    barrier();                                                                   \
    return result;                                                               \
  }
#endif

float add_floats(float a, float b) { return a + b; }
QHX_REDUCE(workgroup_sum, subgroupAdd, add_floats)
QHX_REDUCE(workgroup_max, subgroupMax, max)

#endif
