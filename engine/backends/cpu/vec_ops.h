// The cpu backend's fp32 vector loops that the compiler may not reorder by itself (a sum's order is part of its
// result): a dot product and y += a·x, in AVX2/FMA where the CPU has them (checked once, at run time: the binary
// stays x86-64), else in plain C++ over eight partial sums. Either order differs from a serial loop's by a few units
// in the last place; the serial loop's chain of dependent adds took a fifth of a 16-stream decode step.
#pragma once

#include <cstdint>

namespace inferd {

// Σ a[i]·b[i], i < n.
float Dot(const float* a, const float* b, int64_t n);

// y[i] += alpha · x[i], i < n.
void Axpy(float alpha, const float* x, float* y, int64_t n);

}  // namespace inferd
