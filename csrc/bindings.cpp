// Python bindings of fastbert._C. The fused ops take [rows, hidden] contiguous CPU tensors
// (fastbert.ops reshapes, validates and wraps them in autograd).
#include <torch/csrc/utils/pybind.h>

#include "cpu_ops.h"
#include "launch_program.h"
#include "masking.h"

namespace {

// The kernels run without the GIL: a server's event loop (or any other Python thread) keeps
// running while a model thread computes. They touch no Python object; errors are raised once the
// GIL is held again.
using NoGil = py::call_guard<py::gil_scoped_release>;

// The fused element-wise ops (bias + GELU, add + LayerNorm) and the dropout rule they share.
void register_fused_ops(py::module_& m) {
  m.def("bias_gelu_forward", &fastbert::bias_gelu_forward, py::arg("x"), py::arg("bias"),
        py::arg("approximate") = "none", NoGil(),
        "gelu(x + bias) for x [rows, hidden] (float32/float16/bfloat16) and bias [hidden] (x's dtype or float32); "
        "approximate 'none' (erf) or 'tanh'. Returns y in x's dtype.");
  m.def("bias_gelu_backward", &fastbert::bias_gelu_backward, py::arg("dy"), py::arg("x"), py::arg("bias"),
        py::arg("approximate") = "none", NoGil(),
        "(dx, dbias): dx = dy * gelu'(x + bias) in x's dtype, dbias = column sums of dx (fp32 math, "
        "thread-count independent) in bias's dtype.");
  m.def("geglu_forward", &fastbert::geglu_forward, py::arg("x"), py::arg("approximate") = "none", NoGil(),
        "act(x[:, :n]) * x[:, n:] for x [rows, 2n] (float32/float16/bfloat16); approximate: the gate's activation, "
        "GELU's 'none' (erf) or 'tanh' (GeGLU), or 'silu' (SwiGLU). Returns y [rows, n] in x's dtype.");
  m.def("geglu_backward", &fastbert::geglu_backward, py::arg("dy"), py::arg("x"), py::arg("approximate") = "none", NoGil(),
        "dx [rows, 2n] in x's dtype: dy * x[:, n:] * act'(x[:, :n]) in its first half, dy * act(x[:, :n]) in its "
        "second (fp32 math); approximate as geglu_forward's.");
  m.def(
      "add_layer_norm_forward",
      [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
         const c10::optional<at::Tensor>& bias, double eps, double dropout_p, int64_t seed,
         bool return_sum, bool rms) -> py::tuple {
        auto [y, mean, rstd, sum] = [&] {
          py::gil_scoped_release nogil;  // the tuple below is built with the GIL
          return fastbert::add_layer_norm_forward(x, residual, weight, bias, eps, dropout_p, seed, return_sum, rms);
        }();
        if (return_sum) return py::make_tuple(y, mean, rstd, sum);
        return py::make_tuple(y, mean, rstd);
      },
      py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("dropout_p") = 0.0,
      py::arg("seed") = 0, py::arg("return_sum") = false, py::arg("rms") = false,
      "(y, mean, rstd): y = layer_norm(h) * weight + bias over the last dim, h = dropout(x) + residual, in x's dtype "
      "(bias None: no bias); mean and rstd float32 [rows]. Dropout follows fastbert's Philox rule for `seed`. "
      "return_sum: (y, mean, rstd, h), h in x's dtype, written in the same pass. rms: y = rms_norm(h) * weight "
      "(no bias; mean returned as 0).");
  m.def("add_layer_norm_backward", &fastbert::add_layer_norm_backward, py::arg("dy"), py::arg("x"),
        py::arg("residual"), py::arg("weight"), py::arg("mean"), py::arg("rstd"), py::arg("dropout_p") = 0.0,
        py::arg("seed") = 0, py::arg("dsum") = py::none(), py::arg("rms") = false, NoGil(),
        "(dx, dresidual, dweight, dbias) of add_layer_norm_forward; dweight / dbias summed in double over a "
        "fixed chunking of rows (thread-count independent), returned in weight's dtype. dsum: the gradient of h "
        "(return_sum's output), added to h's before it flows to residual and (through dropout) to x. rms: the "
        "forward's.");
  m.def("dropout_keep_mask", &fastbert::dropout_keep_mask, py::arg("rows"), py::arg("cols"), py::arg("p"),
        py::arg("seed"), NoGil(),
        "bool [rows, cols]: the elements fastbert's dropout keeps (fastbert.reference.dropout_keep_mask).");
  m.def("philox_uint32", &fastbert::philox_uint32, py::arg("seed"), py::arg("start"), py::arg("count"), NoGil(),
        "int64 [count]: Philox-4x32-10 word 0 for the counters start .. start + count - 1 (the kernels' "
        "vector code; fastbert.reference.philox_uint32).");
  m.def("philox_uint32_scalar", &fastbert::philox_uint32_scalar, py::arg("seed"), py::arg("start"),
        py::arg("count"), NoGil(), "philox_uint32 computed one counter at a time in plain C++.");
}

// Attention over a padded batch (key mask) and over packed sequences (cu_seqlens).
void register_attention(py::module_& m) {
  m.def("attention_forward", &fastbert::attention_forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("key_mask"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"),
        py::arg("return_dropout_mask"), py::arg("rope_cos") = py::none(), py::arg("rope_sin") = py::none(), py::arg("window") = -1, py::arg("rel_bias") = py::none(), NoGil(),
        "(out, lse, keep) of softmax(q k^T * scale, padded keys masked) v for q, k, v [batch, heads, seq, head_dim] "
        "(one float dtype, last dim contiguous) and key_mask None or [batch, seq] (True / nonzero = real token). "
        "out: contiguous, q's dtype, zeros at padded queries; lse: float32 [batch, heads, seq]; keep: the bool "
        "[batch, heads, seq, seq] dropout keep-mask when return_dropout_mask, else an empty bool tensor [0]. "
        "rope_cos, rope_sin: float32 [positions, head_dim / 2] rotary tables applied to q and k as they are read "
        "(position: the row index), or None. window >= 0: local attention, each query sees the keys at most "
        "window rows away (the blocks past it are never computed); -1: every key. rel_bias: float32 [heads, 2n - 1] "
        "(n >= seq) or None, entry j - i + n - 1 added to the scaled score of query i and key j.");
  m.def("attention_backward", &fastbert::attention_backward, py::arg("do"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("key_mask"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"),
        py::arg("rope_cos") = py::none(), py::arg("rope_sin") = py::none(), py::arg("window") = -1, py::arg("rel_bias") = py::none(), NoGil(),
        "(dq, dk, dv, drel) of attention_forward (contiguous, q's dtype; zeros at padded positions; thread-count "
        "independent; drel: rel_bias's gradient, or an empty tensor). The dropout mask is regenerated from seed.");
  m.def("varlen_attention_forward", &fastbert::varlen_attention_forward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"),
        py::arg("return_dropout_mask"), py::arg("rope_cos") = py::none(), py::arg("rope_sin") = py::none(), py::arg("window") = -1, py::arg("rel_bias") = py::none(), NoGil(),
        "(out, lse, keep) of attention over packed sequences: q, k, v [tokens, heads, head_dim], cu_seqlens int32 "
        "[batch + 1]. lse: float32 [heads, tokens]; keep: bool [batch, heads, max_seqlen, max_seqlen] when "
        "return_dropout_mask, else an empty bool tensor [0]. rope_cos, rope_sin: as for attention_forward, the "
        "position of a token its index in its sequence.");
  m.def("varlen_attention_backward", &fastbert::varlen_attention_backward, py::arg("do"), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("scale"),
        py::arg("dropout_p"), py::arg("seed"), py::arg("rope_cos") = py::none(), py::arg("rope_sin") = py::none(), py::arg("window") = -1, py::arg("rel_bias") = py::none(), NoGil(),
        "(dq, dk, dv, drel) of varlen_attention_forward.");
  m.def("disentangled_attention_forward", &fastbert::disentangled_attention_forward, py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("key_mask"), py::arg("cu_seqlens"), py::arg("pos_key"), py::arg("pos_query"),
        py::arg("pos_index"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"), NoGil(),
        "(out, lse) of DeBERTa's disentangled attention, softmax((q k^T + c2p + p2c) * scale, padded keys masked) v, "
        "c2p[i, j] = q_i . pos_key[h, pos_index[i - j + n - 1]] and p2c[i, j] = k_j . pos_query[h, that row] "
        "(pos_key, pos_query float [heads, rows, head_dim] or None; pos_index int32 [2n - 1], non-decreasing). "
        "Packed q, k, v [tokens, heads, head_dim] with cu_seqlens (key_mask None), else padded [batch, heads, seq, "
        "head_dim] with key_mask None or [batch, seq]. lse as attention_forward's / varlen_attention_forward's.");
  m.def("disentangled_attention_backward", &fastbert::disentangled_attention_backward, py::arg("do"), py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("key_mask"), py::arg("cu_seqlens"),
        py::arg("pos_key"), py::arg("pos_query"), py::arg("pos_index"), py::arg("scale"), py::arg("dropout_p"),
        py::arg("seed"), NoGil(),
        "(dq, dk, dv, dpos_key, dpos_query) of disentangled_attention_forward (a table's gradient in its dtype, an "
        "empty tensor where it is None; thread-count independent).");
}

// int8 inference: quantization and the GEMM epilogues fused into their consumers.
void register_int8(py::module_& m) {
  m.def("quantize_rows", &fastbert::quantize_rows, py::arg("x"), NoGil(),
        "(q int8 [rows + 1, n], scale, offset float32 [rows]) of x [rows, n] (float32/float16/bfloat16): per row, "
        "offset = (max + min) / 2, scale = (max - min) / 254, q = round((x - offset) * 127 / ((max - min) / 2)), "
        "nearest even; q's last row is all ones (the GEMM's column sums).");
  m.def("int8_dequantize", &fastbert::int8_dequantize, py::arg("acc"), py::arg("row_scale"), py::arg("row_offset"),
        py::arg("col_scale"), py::arg("bias"), py::arg("dtype"), NoGil(),
        "(acc[:-1] * row_scale[:, None] + row_offset[:, None] * acc[-1]) * col_scale + bias as `dtype`, for acc "
        "int32 or float32 [rows + 1, n].");
  m.def("int8_bias_gelu", &fastbert::int8_bias_gelu, py::arg("acc"), py::arg("row_scale"), py::arg("row_offset"),
        py::arg("col_scale"), py::arg("bias"), py::arg("approximate") = "none", NoGil(),
        "quantize_rows(gelu(the dequantized acc)), without the fp32 activation in memory.");
  m.def("int8_glu", &fastbert::int8_glu, py::arg("acc"), py::arg("row_scale"), py::arg("row_offset"),
        py::arg("col_scale"), py::arg("bias") = py::none(), py::arg("gate") = "none", NoGil(),
        "quantize_rows(act(h[:, :n]) * h[:, n:]) of the dequantized acc h [rows, 2n] (a gated feed-forward's gate "
        "and up products); gate: GELU's 'none' (erf) or 'tanh', or 'silu'. No float activation in memory.");
  m.def(
      "int8_add_layer_norm",
      [](const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset, const at::Tensor& col_scale,
         const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& ln_bias,
         double eps, bool quantize, bool return_sum) -> py::tuple {
        auto [y, q, scale, offset, sum] = [&] {
          py::gil_scoped_release nogil;
          return fastbert::int8_add_layer_norm(acc, row_scale, row_offset, col_scale, bias, residual, weight, ln_bias,
                                               eps, quantize, return_sum);
        }();
        if (return_sum) return py::make_tuple(y, q, scale, offset, sum);
        return py::make_tuple(y, q, scale, offset);
      },
      py::arg("acc"), py::arg("row_scale"), py::arg("row_offset"), py::arg("col_scale"), py::arg("bias"),
      py::arg("residual"), py::arg("weight"), py::arg("ln_bias"), py::arg("eps"), py::arg("quantize"),
      py::arg("return_sum") = false,
      "(y, q, scale, offset): y = layer_norm(h) * weight + ln_bias in residual's dtype, h = the dequantized acc + "
      "residual, and quantize_rows(y) when `quantize` (else empty tensors). return_sum: (y, q, scale, offset, h), "
      "h in residual's dtype, written in the same pass.");
  m.def("int8_packed_dequantize", &fastbert::int8_packed_dequantize, py::arg("a"), py::arg("bp"), py::arg("row_scale"),
        py::arg("row_offset"), py::arg("col_scale"), py::arg("bias"), py::arg("dtype"), NoGil(),
        "int8_dequantize of the product a [rows + 1, k] @ bp^T (bp packed), made in chunks of rows that the "
        "epilogue takes while they are in cache.");
  m.def("int8_packed_bias_gelu", &fastbert::int8_packed_bias_gelu, py::arg("a"), py::arg("bp"), py::arg("row_scale"),
        py::arg("row_offset"), py::arg("col_scale"), py::arg("bias"), py::arg("approximate") = "none", NoGil(),
        "int8_bias_gelu of the product a [rows + 1, k] @ bp^T (bp packed), in chunks of rows.");
  m.def("int8_packed_glu", &fastbert::int8_packed_glu, py::arg("a"), py::arg("bp"), py::arg("row_scale"),
        py::arg("row_offset"), py::arg("col_scale"), py::arg("bias") = py::none(), py::arg("gate") = "none", NoGil(),
        "int8_glu of the product a [rows + 1, k] @ bp^T (bp packed, the gate's and the up product's joined), in "
        "chunks of rows.");
  m.def("int8_packed_add_layer_norm", &fastbert::int8_packed_add_layer_norm, py::arg("a"), py::arg("bp"),
        py::arg("row_scale"), py::arg("row_offset"), py::arg("col_scale"), py::arg("bias"), py::arg("residual"),
        py::arg("weight"), py::arg("ln_bias"), py::arg("eps"), py::arg("quantize"), py::arg("return_sum") = false,
        NoGil(),
        "int8_add_layer_norm of the product a [rows + 1, k] @ bp^T (bp packed), in chunks of rows: (y, q, scale, "
        "offset, h), q / scale / offset empty unless `quantize`, h undefined unless return_sum.");
  m.def("set_int8_chunk_rows", &fastbert::set_int8_chunk_rows, py::arg("rows"),
        "The rows a chunk of the int8_packed_* products takes: -1 none (the whole accumulator first), 0 by the "
        "product's width (the default), else that many; returns the previous setting.");
  m.def("int8_gemm", &fastbert::int8_gemm, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), NoGil(),
        "c [m, n] int32 = a [m, k] int8 @ b [n, k] int8 ^T, exact, on the kernel library's int8 GEMM (rows of a "
        "and b contiguous); written into `out` (contiguous int32 [m, n]) when given.");
  m.def("int8_gemm_packed", &fastbert::int8_gemm_packed, py::arg("a"), py::arg("bp"), py::arg("out") = py::none(),
        NoGil(),
        "c [m, n] int32 = a [m, k] int8 @ b^T, exact, with the weight b [n, k] packed as bp [n / 16, ceil(k / 4), 16, 4] "
        "(fastbert.ops.pack_int8_weight); into `out` (contiguous int32 [m, n]) when given.");
  // fp32, beside the int8 GEMM: the linear layers' product for few rows (fastbert.ops.gemm's "dot" path)
  m.def("f32_dot_gemm", &fastbert::f32_dot_gemm, py::arg("a"), py::arg("b"), py::arg("bias") = py::none(),
        py::arg("out") = py::none(), NoGil(),
        "c [m, n] float32 = a [m, k] @ b [n, k] ^T (+ bias [n]), b read as it lies in memory, nothing packed: each "
        "output a dot product of a row of a and a row of b (for few rows of a); into `out` when given.");
}

// A whole encoder layer and a model's stack of them for inference, float and int8 (fastbert.ops.encoder).
void register_layers(py::module_& m) {
  m.def("gemm_path_ids", &fastbert::gemm_path_ids,
        "[(name, id, int8)]: the GEMM paths the layers below run, by fastbert.ops.gemm's names, and the id each "
        "takes in `paths`.");
  m.def("encoder_layer_forward", &fastbert::encoder_layer_forward, py::arg("hidden"), py::arg("weights"),
        py::arg("paths"), py::arg("heads"), py::arg("eps1"), py::arg("eps2"), py::arg("approximate"),
        py::arg("key_mask") = py::none(), py::arg("cu_seqlens") = py::none(), py::arg("max_seqlen") = 0,
        py::arg("rel_bias") = py::none(), NoGil(),
        "A post-LN encoder layer's output (fastbert.ops.encoder_layer's fused path in one call): hidden [batch, seq, "
        "h] with key_mask (bool [batch, seq]) or none, or packed rows [tokens, h] with cu_seqlens; weights: the 12 "
        "tensors of fastbert.ops.LayerWeights; paths: the GEMM path of each of the 4 products (0 addmm, 1 dot).");
  m.def("int8_encoder_layer_forward", &fastbert::int8_encoder_layer_forward, py::arg("hidden"), py::arg("hq"),
        py::arg("hs"), py::arg("ho"), py::arg("weights"), py::arg("paths"), py::arg("heads"), py::arg("eps1"),
        py::arg("eps2"), py::arg("approximate"), py::arg("cu_seqlens"), py::arg("max_seqlen"),
        py::arg("rel_bias") = py::none(), py::arg("quantize_out") = true, NoGil(),
        "(out, q, scale, offset): an int8 post-LN encoder layer on packed rows hidden [tokens, h] and their quantized "
        "rows (hq, hs, ho); weights: QKV (int8, scale, bias), output (int8, scale, bias), norm1 (weight, bias), FFN "
        "in (int8, scale, bias), FFN out (int8, scale, bias), norm2 (weight, bias); paths: the GEMM path of each of "
        "the 4 products (2 fastbert, 3 int_mm, 4 packed weight); (q, scale, offset) empty unless quantize_out.");
  m.def("encoder_forward", &fastbert::encoder_forward, py::arg("hidden"), py::arg("layers"), py::arg("paths"),
        py::arg("heads"), py::arg("eps"), py::arg("approximate"), py::arg("key_mask") = py::none(),
        py::arg("cu_seqlens") = py::none(), py::arg("max_seqlen") = 0, py::arg("rel_bias") = py::none(),
        py::arg("keep_states") = false, NoGil(),
        "A model's layers, each encoder_layer_forward's, in one call: layers[i] = layer i's 12 tensors then the "
        "three parts of each joined one (QKV weight, bias); paths 4 and eps 2 a layer. -> [the last output] "
        "(keep_states: every layer's), or [] where a joined tensor's parts are no longer its slices.");
  m.def("int8_encoder_forward", &fastbert::int8_encoder_forward, py::arg("hidden"), py::arg("hq"), py::arg("hs"),
        py::arg("ho"), py::arg("layers"), py::arg("paths"), py::arg("heads"), py::arg("eps"), py::arg("approximate"),
        py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("rel_bias") = py::none(),
        py::arg("keep_states") = false, NoGil(),
        "A model's int8 layers, each int8_encoder_layer_forward's, in one call: layers[i] = layer i's 16 tensors "
        "then the three parts of each joined one (QKV int8 weight, scale, bias); paths 4 and eps 2 a layer. -> "
        "[the last output] (keep_states: every layer's), or [] where a joined tensor's parts are no longer its "
        "slices.");
}

// A model's layers on the GPU's Triton kernels launched from C++ (fastbert.ops.encoder's CUDA stack). Called with
// the GIL held: a program's variants are registered from Python between calls, never during one.
void register_launch_program(py::module_& m) {
  m.def("launch_role_names", &fastbert::launch_role_names,
        "[[name]] per role (ranges, attention, norm, gelu, norm with sum, geglu): the values a layer computes for "
        "that kernel, in order.");
  py::class_<fastbert::LaunchProgram>(m, "LaunchProgram",
                                      "One layer's launches (a role each) and the compiled variants registered for "
                                      "each, launched through the driver's cuLaunchKernelEx at address launch_fn.")
      .def(py::init<uint64_t, std::vector<int64_t>>(), py::arg("launch_fn"), py::arg("roles"))
      .def("add", &fastbert::LaunchProgram::add, py::arg("position"), py::arg("function"), py::arg("threads"),
           py::arg("shared"), py::arg("kinds"), py::arg("value_kinds"), py::arg("tensors"), py::arg("ints"),
           py::arg("floats"), py::arg("slots"), py::arg("block_m"), py::arg("grid_n"),
           "Register a compiled variant for launch `position` from a recorded launch's arguments.")
      .def("variants", &fastbert::LaunchProgram::variants, py::arg("position"))
      .def("__len__", &fastbert::LaunchProgram::size);
  m.def("post_ln_stack", &fastbert::post_ln_stack, py::arg("program"), py::arg("x"), py::arg("weights"),
        py::arg("eps"), py::arg("heads"), py::arg("key_mask"), py::arg("cu_seqlens"), py::arg("seq"), py::arg("sink"),
        py::arg("stream"), py::arg("keep_states"),
        "Post-LN layers for inference on the Triton kernels, launched from C++: [the last output] (keep_states: "
        "every layer's), or [] where a launch had no registered variant.");
  m.def("pre_ln_stack", &fastbert::pre_ln_stack, py::arg("program"), py::arg("x"), py::arg("weights"),
        py::arg("eps"), py::arg("heads"), py::arg("ropes"), py::arg("key_mask"), py::arg("cu_seqlens"),
        py::arg("seq"), py::arg("sink"), py::arg("stream"),
        "Pre-LN layers (ModernBERT's) for inference on the Triton kernels, launched from C++: [stream, delta] "
        "after the last layer, or [] where a launch had no registered variant.");
}

// The data side: unpad index building, token masking, word starts and the collator's id padding.
void register_data_ops(py::module_& m) {
  m.def("unpad_indices", &fastbert::unpad_indices, py::arg("attention_mask"), NoGil(),
        "(indices int64 [total_tokens], cu_seqlens int32 [batch + 1], max_seqlen int) of a [batch, seq] CPU mask "
        "(bool, integer or float; nonzero = real token): indices are the flat positions b * seq + s of the real "
        "tokens in row-major order.");
  // token masking (masking.h)
  m.def("mask_tokens", &fastbert::mask_tokens, py::arg("input_ids"), py::arg("special_tokens_mask"),
        py::arg("attention_mask"), py::arg("word_start_mask"), py::arg("special_token_ids"),
        py::arg("mask_token_id"), py::arg("vocab_size"), py::arg("mlm_probability"), py::arg("mask_replace_prob"),
        py::arg("random_replace_prob"), py::arg("max_predictions"), py::arg("seed"), py::arg("bernoulli"),
        NoGil(),
        "(masked_input_ids, labels) int64 [batch, seq] by fastbert's MLM masking rule (fastbert.masking.mask_tokens; "
        "the rule in fastbert.reference.mask_tokens). Masks: None or [batch, seq] bool / integer; "
        "special_token_ids: None or int64 [n]; max_predictions < 0: no limit.");
  m.def("word_start_table", &fastbert::word_start_table, py::arg("tokens"), NoGil(),
        "bool [len(tokens)]: True where a WordPiece token starts a word (does not begin with '##').");
  m.def("word_starts", &fastbert::word_starts, py::arg("input_ids"), py::arg("table"),
        NoGil(),
        "bool tensor shaped like int64 input_ids: table[input_ids], ids checked against the table's size.");
  m.def(
      "pad_id_lists",
      [](py::object rows, int64_t seq, int64_t pad_value) { return fastbert::pad_id_lists(rows.ptr(), seq, pad_value); },
      py::arg("rows"), py::arg("seq"), py::arg("pad_value"),
      "int64 [len(rows), seq]: each row (a list or tuple of ints) followed by pad_value.");
}

// The kernel libraries of the instruction-set levels, and the kernels' output memory.
void register_runtime(py::module_& m) {
  m.def("cpu_levels", &fastbert::cpu_levels,
        "The instruction-set levels this CPU (and its OS) can run, lowest first (\"scalar\", \"avx2\", \"avx512\", "
        "\"avx512_vnni\", \"amx\").");
  m.def("cpu_features", &fastbert::cpu_features,
        "The instruction-set extensions this CPU (and its OS) supports among \"avx2\" (with FMA, F16C), "
        "\"avx512\" (F, BW, CD, DQ, VL), \"avx512_vnni\", \"avx512_bf16\" and \"amx\" (TILE, INT8, BF16).");
  m.def("use_kernels", &fastbert::use_kernels, py::arg("levels"), py::arg("paths"),
        "Run every kernel from the kernel libraries at `paths` (one per level in `levels`, lowest first; each "
        "library's kernels stand over the ones below; \"amx\" has no library: its path is empty). Loads each "
        "library once.");
  m.def("kernel_level", &fastbert::kernel_level, "The level of the kernels in use (\"\" before use_kernels).");
  m.def("attention_bf16_available", &fastbert::attention_bf16_available,
        "Whether the bf16 attention's forward can multiply on the BLAS's bf16 GEMM here (a CPU that multiplies "
        "bf16 natively, at a level of avx512 or above).");
  m.def("attention_bf16_min_len", &fastbert::attention_bf16_min_len,
        "The shortest sequence whose bf16 attention multiplies on it (-1: none, fp32 products for all; -1 after "
        "use_kernels until set_attention_bf16_min_len).");
  m.def("set_attention_bf16_min_len", &fastbert::set_attention_bf16_min_len, py::arg("min_len"),
        "bf16 products for the bf16 attention's sequences of at least min_len tokens (-1: none); returns the "
        "previous setting.");
  m.def("int8_amx", &fastbert::int8_amx,
        "Whether the packed int8 GEMM multiplies on AMX's tiles at the level in use (amx, or native on a CPU "
        "with AMX-INT8 whose OS grants the tile state).");
  m.def("release_cached_memory", &fastbert::detail::release_cached_memory,
        "Unmap the freed large-output mappings the kernels keep for reuse (at most 64 of them, 1 GiB in all, and "
        "never more bytes than were ever in use at once).");
  m.def(
      "cached_memory",
      [] {
        const std::array<int64_t, 3> s = fastbert::detail::cached_memory();
        py::dict d;
        d["cached"] = s[0];
        d["in_use"] = s[1];
        d["peak_in_use"] = s[2];
        return d;
      },
      "The large-output allocator's bytes: {cached (kept for reuse), in_use, peak_in_use (the most in use at "
      "once: the bound of the cached ones)}; zeros where it is off.");
  m.def(
      "empty", [](std::vector<int64_t> sizes, at::ScalarType dtype) { return fastbert::detail::empty(sizes, dtype); },
      py::arg("sizes"), py::arg("dtype"),
      "An uninitialised contiguous CPU tensor; one of 4 MiB or more comes from the mapping allocator the kernels' "
      "outputs use (huge pages, freed mappings reused by a request of the same size or up to 2x smaller), "
      "not from malloc.");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastbert C++ extension: fused CPU kernels";
  register_fused_ops(m);
  register_attention(m);
  register_int8(m);
  register_layers(m);
  register_launch_program(m);
  register_data_ops(m);
  register_runtime(m);
}
