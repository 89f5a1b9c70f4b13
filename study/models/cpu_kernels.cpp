// The Python module of loopstudy's fused CPU kernels (built by cpu_kernels.py). A direct call to a bound function
// costs a few microseconds less than a registered torch op's boxed dispatch, which matters at one call per layer.
#include <torch/extension.h>

#include "cpu_kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("infiloop_step", &loopstudy::infiloop_step,
        "One InfiLoop step: (h, log D, gamma, score, next); in_place: h and log D written over h_prev and log_d_prev; "
        "next: h + addend in z's dtype (None without an addend)");
  m.def("rope_qk", &loopstudy::rope_qk,
        "RoPE on the queries and keys of a (B, S, 3 * D) projection: (q, k), each (B, heads, S, D / heads), "
        "in the projection's dtype, laid out as block.py's rotate lays them out");
}
