// loopstudy's fused CPU kernels: their entry points (bound to Python in cpu_kernels.cpp) and the bf16 conversions
// they share, each exactly PyTorch's own.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>

namespace loopstudy {

// One InfiLoop step (infiloop_cpu.cpp): (h, log D, gamma, score, next).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> infiloop_step(
    const at::Tensor& h_prev, const at::Tensor& log_d_prev, const at::Tensor& z, const std::optional<at::Tensor>& q,
    const at::Tensor& log_beta, double clip, double eps, bool in_place, const std::optional<at::Tensor>& addend);

// RoPE on the queries and keys of one attention projection (rope_cpu.cpp): (q, k), each (B, heads, S, head_dim)
// over memory ordered (B, S, heads, head_dim), as block.py's rotate returns them.
std::tuple<at::Tensor, at::Tensor> rope_qk(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                           int64_t heads);

// bf16 -> float32 exactly: the 16 bits are float32's top half.
inline float widen(at::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float widen(float v) { return v; }
inline double widen(double v) { return v; }

// float32 -> bf16 as PyTorch rounds it (c10's round_to_nearest_even): to nearest, ties to even; NaN to 0x7FC0.
inline at::BFloat16 narrow(float v, at::BFloat16*) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  at::BFloat16 out;
  out.x = std::isnan(v) ? uint16_t{0x7FC0} : static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return out;
}
inline float narrow(float v, float*) { return v; }
inline double narrow(double v, double*) { return v; }

}  // namespace loopstudy
