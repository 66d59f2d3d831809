// Python bindings of fastbert._C. The fused ops take [rows, hidden] contiguous CPU tensors
// (fastbert.ops reshapes, validates and wraps them in autograd).
#include <torch/extension.h>

#include "cpu_ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastbert C++ extension: fused CPU kernels";

  m.def("bias_gelu_forward", &fastbert::bias_gelu_forward, py::arg("x"), py::arg("bias"),
        py::arg("approximate") = "none",
        "gelu(x + bias) for x [rows, hidden] (float32/float16/bfloat16) and bias [hidden] (x's dtype or float32); "
        "approximate 'none' (erf) or 'tanh'. Returns y in x's dtype.");
  m.def("bias_gelu_backward", &fastbert::bias_gelu_backward, py::arg("dy"), py::arg("x"), py::arg("bias"),
        py::arg("approximate") = "none",
        "(dx, dbias): dx = dy * gelu'(x + bias) in x's dtype, dbias = column sums of dx (fp32 math, "
        "thread-count independent) in bias's dtype.");
  m.def("add_layer_norm_forward", &fastbert::add_layer_norm_forward, py::arg("x"), py::arg("residual"),
        py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("dropout_p") = 0.0, py::arg("seed") = 0,
        "(y, mean, rstd): y = layer_norm(dropout(x) + residual) * weight + bias over the last dim, in x's dtype; "
        "mean and rstd float32 [rows]. Dropout follows fastbert's Philox rule for `seed`.");
  m.def("add_layer_norm_backward", &fastbert::add_layer_norm_backward, py::arg("dy"), py::arg("x"),
        py::arg("residual"), py::arg("weight"), py::arg("mean"), py::arg("rstd"), py::arg("dropout_p") = 0.0,
        py::arg("seed") = 0,
        "(dx, dresidual, dweight, dbias) of add_layer_norm_forward; dweight / dbias summed in double over a "
        "fixed chunking of rows (thread-count independent), returned in weight's dtype.");
  m.def("dropout_keep_mask", &fastbert::dropout_keep_mask, py::arg("rows"), py::arg("cols"), py::arg("p"),
        py::arg("seed"),
        "bool [rows, cols]: the elements fastbert's dropout keeps (fastbert.reference.dropout_keep_mask).");
  m.def("philox_uint32", &fastbert::philox_uint32, py::arg("seed"), py::arg("start"), py::arg("count"),
        "int64 [count]: Philox-4x32-10 word 0 for the counters start .. start + count - 1 (the kernels' "
        "vector code; fastbert.reference.philox_uint32).");
  m.def("philox_uint32_scalar", &fastbert::philox_uint32_scalar, py::arg("seed"), py::arg("start"),
        py::arg("count"), "philox_uint32 computed one counter at a time in plain C++.");
  m.def("cpu_isa", &fastbert::cpu_isa, "The vector instruction set the kernels were compiled for.");
  m.def("release_cached_memory", &fastbert::detail::release_cached_memory,
        "Unmap the freed large-output mappings the kernels keep for reuse (at most 4 of them, 1 GiB in all).");
}
