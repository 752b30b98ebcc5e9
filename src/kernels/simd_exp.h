// The constants of the vector e^x (Cephes' expf: x = n·ln2 + r, e^r by a degree-7 polynomial,
// times 2^n), shared by each ISA's copy of its steps: every lane does the same float operations,
// so avx2::exp and avx512::exp agree bit for bit (tested).
#pragma once

namespace qhx::cephes_exp {

// x is clamped to [kLowest, kHighest]: results saturate at 1.2e-38 and 1.7e38 instead of 0 and inf.
inline constexpr float kLowest = -87.33654f, kHighest = 88.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
// ln2 split in two so that n·kLn2High is exact.
inline constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
// e^r ≈ 1 + r + r² · p(r), p's coefficients from the highest power down.
inline constexpr float kPolynomial[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

}  // namespace qhx::cephes_exp
