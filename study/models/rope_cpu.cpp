// RoPE on the queries and keys of one attention projection, in one CPU pass; called through rope_kernel.py.
//
// Eager PyTorch (block.py's `rotate`) takes seven passes over each of q and k: a cast up to float32, a negation, a
// concatenation, two products, a sum and a cast down. Here each head's row is read once from the projection and
// written once, rotated, in the layout `rotate` returns: (B, heads, S, head_dim) over memory ordered as the
// projection's (B, S, heads, head_dim), so attention reads the same strides either way. The arithmetic is `rotate`'s:
//   out[i]        = x[i] cos[i]        + (-x[i + half]) sin[i]
//   out[i + half] = x[i + half] cos[i + half] + x[i] sin[i + half]
// in float32 (float64 for a float64 model, the float32 tables widened), each product and the sum rounded on its
// own, then rounded to the projection's dtype as `.to()` rounds. Bit for bit `rotate`'s result: this file is
// compiled with -ffp-contract=off (cpu_kernels.py), so no product is fused into the sum; and (-a) b + c equals
// c - a b exactly in IEEE arithmetic.
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

#include <algorithm>

namespace loopstudy {
namespace {

template <typename X, typename C>  // X: the projection's dtype; C: the arithmetic's (float, or double)
void rotate_tokens(const X* qkv, const float* cos, const float* sin, X* q_out, X* k_out, int64_t S, int64_t heads,
                   int64_t hd, int64_t begin, int64_t end) {
  const int64_t D = heads * hd, half = hd / 2;
  for (int64_t t = begin; t < end; ++t) {  // token t = b * S + s
    const float* c = cos + (t % S) * hd;
    const float* n = sin + (t % S) * hd;
    for (int64_t part = 0; part < 2; ++part) {  // queries, then keys
      X* out_base = part == 0 ? q_out : k_out;
      for (int64_t h = 0; h < heads; ++h) {
        const X* x = qkv + (t * 3 + part) * D + h * hd;
        X* out = out_base + (t * heads + h) * hd;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const C lo = widen(x[i]), hi = widen(x[i + half]);
          const C lo_cos = lo * static_cast<C>(c[i]), hi_sin = hi * static_cast<C>(n[i]);
          const C hi_cos = hi * static_cast<C>(c[i + half]), lo_sin = lo * static_cast<C>(n[i + half]);
          out[i] = narrow(lo_cos - hi_sin, out);
          out[i + half] = narrow(hi_cos + lo_sin, out);
        }
      }
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_qk(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                           int64_t heads) {
  TORCH_CHECK(qkv.dim() == 3 && heads > 0 && qkv.size(2) % (3 * heads) == 0,
              "rope_qk: qkv must be (B, S, 3 * D) with D a multiple of heads");
  const int64_t B = qkv.size(0), S = qkv.size(1), hd = qkv.size(2) / (3 * heads);
  TORCH_CHECK(hd % 2 == 0, "rope_qk: head_dim must be even");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                  cos.size(0) == S && cos.size(1) == hd && sin.sizes() == cos.sizes(),
              "rope_qk: cos and sin must be float32 (S, head_dim)");
  const at::Tensor x = qkv.contiguous(), c = cos.contiguous(), n = sin.contiguous();
  // ATen's own CPU allocation (see infiloop_cpu.cpp): torch is pinned and the library is keyed by its version.
  const std::vector<int64_t> shape{B, S, heads, hd};
  at::Tensor q = at::detail::empty_cpu(shape, x.scalar_type(), false, std::nullopt);
  at::Tensor k = at::detail::empty_cpu(shape, x.scalar_type(), false, std::nullopt);
  const auto run = [&](auto x_type, auto c_type) {
    using X = decltype(x_type);
    using C = decltype(c_type);
    const X* src = x.const_data_ptr<X>();
    X* qo = q.data_ptr<X>();
    X* ko = k.data_ptr<X>();
    const float* cp = c.const_data_ptr<float>();
    const float* np = n.const_data_ptr<float>();
    const auto body = [&](int64_t begin, int64_t end) { rotate_tokens<X, C>(src, cp, np, qo, ko, S, heads, hd, begin, end); };
    const int64_t grain = std::max<int64_t>(1, 16384 / (2 * heads * hd));  // threads only where they pay
    if (B * S <= grain) {
      body(0, B * S);
    } else {
      at::parallel_for(0, B * S, grain, body);
    }
  };
  switch (x.scalar_type()) {
    case at::kBFloat16: run(at::BFloat16{}, float{}); break;
    case at::kFloat: run(float{}, float{}); break;
    case at::kDouble: run(double{}, double{}); break;
    default: TORCH_CHECK(false, "rope_qk: qkv must be bf16, float32 or float64");
  }
  return {q.permute({0, 2, 1, 3}), k.permute({0, 2, 1, 3})};
}

}  // namespace loopstudy
