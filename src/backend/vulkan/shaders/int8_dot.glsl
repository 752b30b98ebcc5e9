// dot4x8(a, b): the sum of the products of the four signed bytes of two words, in one
// instruction: OpSDot of SPV_KHR_integer_dot_product (packed vector format 0), as
// GL_EXT_integer_dot_product's dot4x8 would give it, which Debian 12's glslang predates. For
// devices with shaderIntegerDotProduct. Include before any other declaration: the extension
// must come first.
#ifndef QHX_INT8_DOT_GLSL
#define QHX_INT8_DOT_GLSL
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019],
                  id = 4450)
int signed_dot_spirv(int a, int b, spirv_literal int packed_format);
int dot4x8(int a, int b) { return signed_dot_spirv(a, b, 0); }
#endif
