// One InfiLoop step fused into one CPU pass per token (methods.md section 3); called through infiloop_kernel.py.
//
// Eager PyTorch spends about 13 small kernels on this step, each paying a fixed dispatch cost that dwarfs its work
// at the model's sizes. Here every row (one token's d-vector) is read once: the content score, the log-space
// accumulator, the weight and the convex update, with the formulas of carry.py's infiloop_update_eager:
//   s = min(q . z / sqrt(mean(z^2) + eps), clip)      (s = 0 without q)
//   log D = logaddexp(log D_prev + log beta, s);  gamma = exp(s - log D);  h = h_prev + gamma (z - h_prev)
// Forward only: carry.py calls it when no gradient is recorded (rollouts and evaluation). Under a bf16 reading the
// candidate z arrives in bf16 and the state in float32: z is widened as it is read (bf16 is float32's top half),
// which spares a whole widened copy of z per layer.
// With an addend (a reading: the next block's input is the new state plus the addend), the step also writes that
// sum, rounded to z's dtype (the block's), from the same pass: as `(h + addend).to(z.dtype)` computes it, bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>

namespace loopstudy {
namespace {

template <typename T, typename Z = T, typename A = T>
struct Rows {
  const Z* z;       // (rows, d) candidates, in T or (for float32 states) bf16
  const A* addend;  // (rows, d) the next input's addend, in T or (for float32 states) bf16; or null
  const T* h;       // (rows, d) carried states
  const T* log_d;   // (rows) accumulators
  const T* q;       // (d) pseudo-query, or null: s = 0
  T log_beta, clip, eps;
  int64_t d;
  T* h_out;         // (rows, d)
  T* log_d_out;     // (rows)
  T* gamma_out;     // (rows)
  T* score_out;     // (rows)
  Z* next_out;      // (rows, d) h_out + addend in z's dtype, or null (without an addend)
};

// exp(x) for x <= 0 and log1p(t) for t in [0, 1] as straight-line float code (Cephes' expf and logf polynomials,
// ~1 ulp), so a loop over tokens becomes SIMD; libm's scalar calls would cost more than the rest of the step.
// float64 uses libm.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // exp(-87) ~ 1.6e-38: below that the weight's contribution is lost in rounding anyway
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  x = x - n * 0.693359375f - n * -2.12194440e-4f;
  const float y = ((((((1.9875691500e-4f * x + 1.3981999507e-3f) * x + 8.3334519073e-3f) * x + 4.1665795894e-2f) * x +
                     1.6666665459e-1f) * x + 5.0000001201e-1f) * x * x) + x + 1.0f;
  int32_t bits = static_cast<int32_t>(n + 127.0f) << 23;  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

inline float log1p_unit(float t) {
  // log(1 + t) = e ln 2 + log(m), m = (1 + t) / 2^e in [sqrt(1/2), sqrt(2)); f = m - 1 exact when e = 0
  const bool halve = t > 0.41421356237f;
  const float f = halve ? 0.5f * (t - 1.0f) : t;
  const float e = halve ? 1.0f : 0.0f;
  const float z = f * f;
  float y = ((((((((7.0376836292e-2f * f - 1.1514610310e-1f) * f + 1.1676998740e-1f) * f - 1.2420140846e-1f) * f +
                 1.4249322787e-1f) * f - 1.6668057665e-1f) * f + 2.0000714765e-1f) * f - 2.4999993993e-1f) * f +
             3.3333331174e-1f) * f * z;
  y += e * -2.12194440e-4f - 0.5f * z;
  return f + y + e * 0.693359375f;
}

inline double exp_nonpositive(double x) { return std::exp(x); }
inline double log1p_unit(double t) { return std::log1p(t); }

// q . z and z . z of one row. The float version keeps its partial sums in registers and folds them with shuffles:
// the compiler's own reduction spills its accumulators to the stack and reads them back lane by lane, which cost
// more than the sums themselves at d = 64.
typedef float float8 __attribute__((vector_size(32)));

inline float fold(float8 a) {
  a += __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3);
  a += __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
  a += __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6);
  return a[0];
}

typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

// Eight values of a row as float: unaligned loads; bf16 widened eight at once (each one's bits shifted up by 16).
inline float8 load8(const float* p) {
  float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float8 load8(const at::BFloat16* p) {
  u16x8 raw;
  std::memcpy(&raw, p, sizeof raw);
  const u32x8 bits = __builtin_convertvector(raw, u32x8) << 16;
  float8 v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

template <typename Z>  // float or at::BFloat16 candidates, float sums
inline void row_sums(const float* q, const Z* z, int64_t d, float& dot, float& sq) {
  float8 ad = {}, as = {};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const float8 zv = load8(z + i), qv = load8(q + i);
    ad += qv * zv;
    as += zv * zv;
  }
  dot = fold(ad);
  sq = fold(as);
  for (; i < d; ++i) {
    const float zi = widen(z[i]);
    dot += q[i] * zi;
    sq += zi * zi;
  }
}

inline void row_sums(const double* q, const double* z, int64_t d, double& dot, double& sq) {
  dot = 0;
  sq = 0;
  for (int64_t i = 0; i < d; ++i) {
    dot += q[i] * z[i];
    sq += z[i] * z[i];
  }
}

template <typename T, typename Z, typename A>
void step_block(const Rows<T, Z, A>& p, int64_t begin, int64_t end) {
  const int64_t d = p.d;
  T* score = p.score_out;
  for (int64_t r = begin; r < end; ++r) {  // the content score: two sums over the row
    T s = 0;
    if (p.q != nullptr) {
      const Z* z = p.z + r * d;
      T dot, sq;
      row_sums(p.q, z, d, dot, sq);
      s = std::min(dot / std::sqrt(sq / static_cast<T>(d) + p.eps), p.clip);
    }
    score[r] = s;
  }
  // logaddexp(a, s) and gamma = exp(s - log D) from one exp and one log1p: with t = exp(-|a - s|),
  // log D = max(a, s) + log1p(t), and gamma = 1 / (1 + t) if s >= a, else t / (1 + t). Before an axis's first
  // candidate a = -inf, so t = 0: log D = s and gamma = 1.
#pragma omp simd
  for (int64_t r = begin; r < end; ++r) {
    const T s = score[r];
    const T a = p.log_d[r] + p.log_beta;
    const T t = exp_nonpositive(-std::abs(a - s));
    p.log_d_out[r] = std::max(a, s) + log1p_unit(t);
    p.gamma_out[r] = (s >= a ? T(1) : t) / (1 + t);
  }
  for (int64_t r = begin; r < end; ++r) {  // h = h_prev + gamma (z - h_prev)
    const T g = p.gamma_out[r];
    const Z* z = p.z + r * d;
    const T* h = p.h + r * d;
    T* out = p.h_out + r * d;
    if (p.next_out == nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out[i] = h[i] + g * (widen(z[i]) - h[i]);
    } else {  // ... and the next block's input, h + addend, in z's dtype
      const A* a = p.addend + r * d;
      Z* next = p.next_out + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) {
        const T v = h[i] + g * (widen(z[i]) - h[i]);
        out[i] = v;
        next[i] = narrow(v + widen(a[i]), next);
      }
    }
  }
}

// A few rows at a time, so the update's second read of z comes from L1 rather than from L2.
template <typename T, typename Z, typename A>
void step_rows(const Rows<T, Z, A>& p, int64_t begin, int64_t end) {
  const int64_t block = std::max<int64_t>(1, 4096 / static_cast<int64_t>(sizeof(Z)) / p.d);  // 4 KiB of z
  for (int64_t b = begin; b < end; b += block) step_block(p, b, std::min(b + block, end));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> infiloop_step(
    const at::Tensor& h_prev, const at::Tensor& log_d_prev, const at::Tensor& z, const std::optional<at::Tensor>& q,
    const at::Tensor& log_beta, double clip, double eps, bool in_place, const std::optional<at::Tensor>& addend) {
  TORCH_CHECK(z.sizes() == h_prev.sizes(), "infiloop_step: h_prev and z differ in shape");
  const bool narrow_z = z.scalar_type() == at::kBFloat16 && h_prev.scalar_type() == at::kFloat;
  TORCH_CHECK((narrow_z || z.dtype() == h_prev.dtype()) && h_prev.dtype() == log_d_prev.dtype(),
              "infiloop_step: dtypes differ (z may be bf16 only beside float32 states)");
  const int64_t d = z.size(-1);
  const int64_t rows = z.numel() / d;
  TORCH_CHECK(log_d_prev.numel() == rows, "infiloop_step: log_d_prev must hold one value per token");
  TORCH_CHECK(log_beta.numel() == 1 && log_beta.dtype() == h_prev.dtype(), "infiloop_step: log_beta must be one value");
  TORCH_CHECK(!q.has_value() || (q->dtype() == h_prev.dtype() && q->numel() == d), "infiloop_step: q must be d values");
  const at::Tensor zc = z.contiguous(), hc = h_prev.contiguous(), lc = log_d_prev.contiguous();
  TORCH_CHECK(!in_place || !hc.is_same(zc), "infiloop_step: in place, h_prev must not be z");
  const at::Tensor qc = q.has_value() ? q->contiguous() : at::Tensor();
  const bool narrow_a = addend.has_value() && addend->scalar_type() == at::kBFloat16 && h_prev.scalar_type() == at::kFloat;
  TORCH_CHECK(!addend.has_value() || (addend->sizes() == z.sizes() && (narrow_a || addend->dtype() == h_prev.dtype())),
              "infiloop_step: addend must be z's shape, in the states' dtype (or bf16 beside float32 states)");
  const at::Tensor ac = addend.has_value() ? addend->contiguous() : at::Tensor();
  // Straight from the CPU allocator: through the dispatcher (at::empty), the four allocations cost about as much
  // as the step's arithmetic at batch 8. at::detail::empty_cpu is ATen's own CPU allocation path, outside its
  // stable API: torch is pinned (pyproject) and the built library is keyed by torch's version.
  const auto shape = lc.sizes();
  const auto dtype = hc.scalar_type();
  // In place, h and log D overwrite the (contiguous copies of the) previous ones: each row is read before it is
  // written. At batch 64 the fresh h cost more than the arithmetic, its lines fetched from memory only to be
  // overwritten.
  at::Tensor h = in_place ? hc : at::Tensor(at::detail::empty_cpu(zc.sizes(), dtype, false, std::nullopt));
  at::Tensor log_d = in_place ? lc : at::Tensor(at::detail::empty_cpu(shape, dtype, false, std::nullopt));
  at::Tensor gamma = at::detail::empty_cpu(shape, dtype, false, std::nullopt);
  at::Tensor score = at::detail::empty_cpu(shape, dtype, false, std::nullopt);
  at::Tensor next = ac.defined() ? at::Tensor(at::detail::empty_cpu(zc.sizes(), zc.scalar_type(), false, std::nullopt))
                                 : at::Tensor();
  const auto run = [&](const auto& p) {
    // Threads only past ~32k elements: below that, waking them costs more than the work (and a direct call runs
    // less code between the model's blocks than parallel_for's inline path).
    const int64_t grain = std::max<int64_t>(1, 32768 / d);
    if (rows <= grain) {
      step_rows(p, 0, rows);
    } else {
      at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) { step_rows(p, begin, end); });
    }
  };
  // The rows of one dtype triple: states, accumulators and outputs in T, candidates (and the next input) in Z, the
  // addend in A.
  const auto rows_of = [&](auto t, auto z_type, auto a_type) {
    using T = decltype(t);
    using Z = decltype(z_type);
    using A = decltype(a_type);
    return Rows<T, Z, A>{zc.const_data_ptr<Z>(), ac.defined() ? ac.const_data_ptr<A>() : nullptr,
                         hc.const_data_ptr<T>(), lc.const_data_ptr<T>(),
                         qc.defined() ? qc.const_data_ptr<T>() : nullptr, *log_beta.const_data_ptr<T>(),
                         static_cast<T>(clip), static_cast<T>(eps), d, h.data_ptr<T>(), log_d.data_ptr<T>(),
                         gamma.data_ptr<T>(), score.data_ptr<T>(), next.defined() ? next.data_ptr<Z>() : nullptr};
  };
  if (narrow_z && narrow_a) {
    run(rows_of(float{}, at::BFloat16{}, at::BFloat16{}));
  } else if (narrow_z) {
    run(rows_of(float{}, at::BFloat16{}, float{}));
  } else if (narrow_a) {
    run(rows_of(float{}, float{}, at::BFloat16{}));
  } else {
    AT_DISPATCH_FLOATING_TYPES(dtype, "infiloop_step", [&] { run(rows_of(scalar_t{}, scalar_t{}, scalar_t{})); });
  }
  return {h, log_d, gamma, score, next};
}

}  // namespace loopstudy
