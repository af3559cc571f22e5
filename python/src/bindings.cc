// pybind11 bindings: argument conversion only. Every computation is in the C++ library; the GIL is
// released while it runs. headlight::Error becomes ValueError.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "conversions.h"
#include "gpt_bindings.h"
#include "headlight/attention/multihead_attention.h"
#include "headlight/attention/sdpa.h"
#include "headlight/core/cpu_info.h"

namespace headlight::python {
namespace {

using attention::MhaForwardOptions;
using attention::MultiheadAttention;
using attention::MultiheadAttentionConfig;
using attention::SdpaOptions;

py::object maybe_array(const py::object& obj, const char* what, py::array& keep) {
  if (obj.is_none()) return obj;
  keep = as_mask(obj, what);
  return keep;
}

SdpaOptions sdpa_options(const py::object& attn_mask, py::array& mask_keep, float dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa,
                         uint64_t seed, const std::string& kernel) {
  SdpaOptions o;
  if (!maybe_array(attn_mask, "attn_mask", mask_keep).is_none()) o.attn_mask = view_of(mask_keep);
  o.dropout_p = dropout_p;
  o.dropout_seed = seed;
  o.is_causal = is_causal;
  if (scale) o.scale = static_cast<float>(*scale);
  o.enable_gqa = enable_gqa;
  o.kernel = attention::parse_kernel_choice(kernel, "kernel");
  return o;
}

int checked_threads(int threads) {
  check(threads >= 0, "threads: must be 0 (OpenMP's default) or more, got {}", threads);
  return threads;
}

// The functional SDPA (forward and backward) runs on a ThreadContext per calling thread and thread
// count, kept between calls: the kernels' scratch (packed keys, per-worker tiles, the backward's
// partial gradients) is then reused instead of faulted in anew by every call (a fresh page costs
// 3–12 µs per 4 KiB on these virtual machines: 5–10% of a call at N = 512). Results do not depend
// on it. A context left holding more than kKeptScratch after a call is dropped, so that one large
// call does not pin its memory. Python threads each have their own (the calls release the GIL).
constexpr size_t kKeptScratch = size_t{256} << 20;

template <class Fn>
auto with_sdpa_context(int threads, Fn&& fn) {
  thread_local std::map<int, std::unique_ptr<ThreadContext>> contexts;
  // Keyed by the count the call runs on: threads = 0 follows OpenMP's setting of the moment.
  const int n = ThreadContext::resolved_threads(checked_threads(threads));
  std::unique_ptr<ThreadContext>& slot = contexts[n];
  if (!slot) slot = std::make_unique<ThreadContext>(n);
  struct Trim {
    std::unique_ptr<ThreadContext>& slot;
    ~Trim() {
      if (slot && slot->scratch_bytes() > kKeptScratch) slot.reset();
    }
  } trim{slot};
  return fn(*slot);
}

// The Python MultiheadAttention: the C++ module plus the thread context it runs on.
struct PyMultiheadAttention {
  MultiheadAttention module;
  ThreadContext ctx;
  bool bf16_io = false;  // the last forward's query was bfloat16: outputs and gradients are too
};

// `tensor` as a numpy array of float32, or rounded to bfloat16 when `bf16` (PyTorch returns a
// module's outputs and input gradients in its inputs' dtype).
py::array in_io_dtype(Tensor&& tensor, bool bf16) {
  if (!bf16) return to_numpy(std::move(tensor));
  Tensor rounded(DType::bf16, tensor.shape());
  to_bf16(tensor.data(), rounded.data<headlight::bf16>(), static_cast<size_t>(tensor.numel()));
  return to_numpy(std::move(rounded));
}

py::dict tensors_to_dict(const MultiheadAttention& m, bool grads) {
  py::dict out;
  for (const std::string& name : m.parameter_names()) {
    const Tensor& t = grads ? m.grad(name) : m.parameter(name);
    out[py::str(name)] = to_numpy(contiguous_copy(t.view()));
  }
  return out;
}

py::tuple mha_forward(PyMultiheadAttention& self, const py::object& query, const py::object& key,
                      const py::object& value, const py::object& key_padding_mask,
                      bool need_weights, const py::object& attn_mask, bool average_attn_weights,
                      bool is_causal) {
  // bfloat16 inputs are widened exactly and computed in fp32 (the parameters are fp32); the
  // output and the weights come back rounded to bfloat16. Not mixed with other dtypes, as in
  // PyTorch, whose projections refuse a mix.
  check_bfloat16_not_mixed({query, key, value}, {"query", "key", "value"});
  const py::array query_array = py::array::ensure(query);
  self.bf16_io = query_array && is_bfloat16(query_array);
  py::array q = as_float32(query, "query"), k = as_float32(key, "key");
  py::array v = as_float32(value, "value"), kpm_keep, am_keep;
  MhaForwardOptions o;
  if (!maybe_array(key_padding_mask, "key_padding_mask", kpm_keep).is_none())
    o.key_padding_mask = view_of(kpm_keep);
  if (!maybe_array(attn_mask, "attn_mask", am_keep).is_none()) o.attn_mask = view_of(am_keep);
  o.need_weights = need_weights;
  o.average_attn_weights = average_attn_weights;
  o.is_causal = is_causal;
  attention::MhaOutput out;
  const TensorView qv = view_of(q), kv = view_of(k), vv = view_of(v);  // with the GIL held
  {
    py::gil_scoped_release release;
    out = self.module.forward(self.ctx, qv, kv, vv, o);
  }
  py::object weights = py::none();
  if (out.weights.defined()) weights = in_io_dtype(std::move(out.weights), self.bf16_io);
  return py::make_tuple(in_io_dtype(std::move(out.output), self.bf16_io), weights);
}

// MultiheadAttention(embed_dim, num_heads, …) with torch.nn.MultiheadAttention's arguments.
PyMultiheadAttention* make_multihead_attention(int64_t embed_dim, int64_t num_heads, float dropout,
                                               bool bias, bool add_bias_kv, bool add_zero_attn,
                                               std::optional<int64_t> kdim,
                                               std::optional<int64_t> vdim, bool batch_first,
                                               std::optional<int64_t> num_kv_heads, uint64_t seed,
                                               std::optional<int> threads,
                                               const std::string& kernel) {
  if (kdim) check(*kdim > 0, "kdim: must be positive, got {}", *kdim);
  if (vdim) check(*vdim > 0, "vdim: must be positive, got {}", *vdim);
  if (num_kv_heads)
    check(*num_kv_heads > 0, "num_kv_heads: must be positive, got {}", *num_kv_heads);
  const MultiheadAttentionConfig c{.embed_dim = embed_dim,
                                   .num_heads = num_heads,
                                   .dropout = dropout,
                                   .bias = bias,
                                   .add_bias_kv = add_bias_kv,
                                   .add_zero_attn = add_zero_attn,
                                   .kdim = kdim.value_or(0),
                                   .vdim = vdim.value_or(0),
                                   .batch_first = batch_first,
                                   .num_kv_heads = num_kv_heads.value_or(0),
                                   .kernel = attention::parse_kernel_choice(kernel, "kernel")};
  return new PyMultiheadAttention{MultiheadAttention(c, seed), ThreadContext(threads.value_or(0))};
}

// headlight.scaled_dot_product_attention (and _sdpa_positional: the same without keyword
// processing, for headlight.torch's per-call cost).
py::object sdpa_call(const py::object& query, const py::object& key, const py::object& value,
                     const py::object& attn_mask, float dropout_p, bool is_causal,
                     std::optional<double> scale, bool enable_gqa, uint64_t seed,
                     const std::string& kernel, bool return_lse, bool return_probs, int threads) {
  check_bfloat16_not_mixed({query, key, value}, {"query", "key", "value"});
  py::array q = as_attention_input(query, "query"), k = as_attention_input(key, "key");
  py::array v = as_attention_input(value, "value"), mask_keep;
  SdpaOptions o =
      sdpa_options(attn_mask, mask_keep, dropout_p, is_causal, scale, enable_gqa, seed, kernel);
  attention::SdpaOutput r;
  const TensorView qv = view_of(q), kv = view_of(k), vv = view_of(v);  // with the GIL held
  checked_threads(threads);
  {
    py::gil_scoped_release release;
    with_sdpa_context(threads, [&](ThreadContext& ctx) {
      if (return_lse || return_probs)
        r = attention::scaled_dot_product_attention_with_lse(ctx, qv, kv, vv, o, return_probs);
      else
        r.output = attention::scaled_dot_product_attention(ctx, qv, kv, vv, o);
    });
  }
  if (!return_lse && !return_probs) return to_numpy(std::move(r.output));
  py::list result;
  result.append(to_numpy(std::move(r.output)));
  if (return_lse) result.append(to_numpy(std::move(r.lse)));
  if (return_probs) result.append(to_numpy(std::move(r.probs)));
  return py::tuple(result);
}

void bind_sdpa(py::module_& m) {
  m.def("_sdpa_positional", &sdpa_call);
  m.def(
      "scaled_dot_product_attention", &sdpa_call, py::arg("query"), py::arg("key"),
      py::arg("value"), py::arg("attn_mask") = py::none(), py::arg("dropout_p") = 0.0f,
      py::arg("is_causal") = false, py::arg("scale") = py::none(), py::arg("enable_gqa") = false,
      py::kw_only(), py::arg("seed") = 0, py::arg("kernel") = "automatic",
      py::arg("return_lse") = false, py::arg("return_probs") = false, py::arg("threads") = 0,
      "PyTorch's scaled_dot_product_attention semantics; a row with no allowed key gives zeros. "
      "float32 or ml_dtypes.bfloat16 arrays (all three of one dtype; the output has it). With "
      "return_lse, (output, lse): lse is each row's log-sum-exp of its scores (float32, the "
      "output's shape without its last dim), which the backward can take with the output. "
      "return_probs appends the exact probabilities (float32 (..., L, S), after dropout). threads: "
      "0 for OpenMP's default.");

  m.def(
      "scaled_dot_product_attention_backward",
      [](const py::object& query, const py::object& key, const py::object& value,
         const py::object& grad_output, const py::object& attn_mask, bool is_causal,
         std::optional<double> scale, bool enable_gqa, const std::string& kernel, float dropout_p,
         uint64_t seed, const py::object& output, const py::object& lse, int threads) {
        check_bfloat16_not_mixed({query, key, value}, {"query", "key", "value"});
        py::array q = as_attention_input(query, "query"), k = as_attention_input(key, "key");
        py::array v = as_attention_input(value, "value");
        py::array go = as_attention_input(grad_output, "grad_output");
        py::array mask_keep, out_keep, lse_keep;
        SdpaOptions o = sdpa_options(attn_mask, mask_keep, dropout_p, is_causal, scale, enable_gqa,
                                     seed, kernel);
        attention::SdpaSaved saved;
        if (!output.is_none()) {
          out_keep = as_attention_input(output, "output");
          saved.output = view_of(out_keep);
        }
        if (!lse.is_none()) {
          lse_keep = as_attention_input(lse, "lse");
          saved.lse = view_of(lse_keep);
        }
        attention::SdpaGrads g;
        const TensorView qv = view_of(q), kv = view_of(k), vv = view_of(v), gv = view_of(go);
        checked_threads(threads);
        {
          py::gil_scoped_release release;
          with_sdpa_context(threads, [&](ThreadContext& ctx) {
            g = attention::scaled_dot_product_attention_backward(ctx, qv, kv, vv, gv, o, saved);
          });
        }
        return py::make_tuple(to_numpy(std::move(g.query)), to_numpy(std::move(g.key)),
                              to_numpy(std::move(g.value)));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("grad_output"),
      py::arg("attn_mask") = py::none(), py::arg("is_causal") = false,
      py::arg("scale") = py::none(), py::arg("enable_gqa") = false, py::kw_only(),
      py::arg("kernel") = "automatic", py::arg("dropout_p") = 0.0f, py::arg("seed") = 0,
      py::arg("output") = py::none(), py::arg("lse") = py::none(), py::arg("threads") = 0,
      "Gradients (grad_query, grad_key, grad_value) of scaled_dot_product_attention (with its "
      "dropout_p and seed). output and lse (the forward's, return_lse=True) spare recomputing "
      "the forward.");
}

void bind_multihead_attention(py::module_& m) {
  py::class_<PyMultiheadAttention>(m, "MultiheadAttention")
      .def(py::init(&make_multihead_attention), py::arg("embed_dim"), py::arg("num_heads"),
           py::arg("dropout") = 0.0f, py::arg("bias") = true, py::arg("add_bias_kv") = false,
           py::arg("add_zero_attn") = false, py::arg("kdim") = py::none(),
           py::arg("vdim") = py::none(), py::arg("batch_first") = false,
           py::arg("num_kv_heads") = py::none(), py::kw_only(), py::arg("seed") = 0,
           py::arg("threads") = py::none(), py::arg("kernel") = "automatic")
      .def_property_readonly(
          "embed_dim", [](const PyMultiheadAttention& s) { return s.module.config().embed_dim; })
      .def_property_readonly(
          "num_heads", [](const PyMultiheadAttention& s) { return s.module.config().num_heads; })
      .def_property_readonly(
          "num_kv_heads",
          [](const PyMultiheadAttention& s) { return s.module.config().num_kv_heads; })
      .def_property_readonly("head_dim",
                             [](const PyMultiheadAttention& s) { return s.module.head_dim(); })
      .def_property_readonly("kdim",
                             [](const PyMultiheadAttention& s) { return s.module.config().kdim; })
      .def_property_readonly("vdim",
                             [](const PyMultiheadAttention& s) { return s.module.config().vdim; })
      .def_property_readonly(
          "batch_first",
          [](const PyMultiheadAttention& s) { return s.module.config().batch_first; })
      .def_property_readonly(
          "dropout", [](const PyMultiheadAttention& s) { return s.module.config().dropout; })
      .def_property_readonly("training",
                             [](const PyMultiheadAttention& s) { return s.module.training(); })
      .def(
          "train",
          [](PyMultiheadAttention& s, bool mode) -> PyMultiheadAttention& {
            s.module.set_training(mode);
            return s;
          },
          py::arg("mode") = true, py::return_value_policy::reference)
      .def(
          "eval",
          [](PyMultiheadAttention& s) -> PyMultiheadAttention& {
            s.module.set_training(false);
            return s;
          },
          py::return_value_policy::reference)
      .def("state_dict",
           [](const PyMultiheadAttention& s) { return tensors_to_dict(s.module, false); })
      .def(
          "load_state_dict",
          [](PyMultiheadAttention& s, const py::dict& state) {
            std::map<std::string, py::array> keep;
            std::map<std::string, TensorView> views;
            for (auto [key, value] : state) {
              const std::string name = py::str(key);
              keep[name] = as_float32(value, name.c_str());
              views[name] = view_of(keep[name]);
            }
            s.module.load_state_dict(views);
          },
          py::arg("state_dict"))
      .def_property_readonly(
          "grads", [](const PyMultiheadAttention& s) { return tensors_to_dict(s.module, true); })
      .def_property(
          "head_gates",
          [](const PyMultiheadAttention& s) {
            return gates_to_numpy(s.module.head_gates(), false, {s.module.config().num_heads});
          },
          [](PyMultiheadAttention& s, const py::object& gates) {
            set_gates(s.module.head_gates(), gates, {s.module.config().num_heads}, "head_gates");
          })
      .def_property_readonly("head_gates_grad",
                             [](const PyMultiheadAttention& s) {
                               return gates_to_numpy(s.module.head_gates(), true,
                                                     {s.module.config().num_heads});
                             })
      .def("forward", &mha_forward, py::arg("query"), py::arg("key"), py::arg("value"),
           py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
           py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true,
           py::arg("is_causal") = false)
      .def("__call__", &mha_forward, py::arg("query"), py::arg("key"), py::arg("value"),
           py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
           py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true,
           py::arg("is_causal") = false)
      .def(
          "backward",
          [](PyMultiheadAttention& s, const py::object& grad_output) {
            py::array go = as_float32(grad_output, "grad_output");
            attention::MhaInputGrads g;
            const TensorView gv = view_of(go);  // with the GIL held
            {
              py::gil_scoped_release release;
              g = s.module.backward(s.ctx, gv);
            }
            return py::make_tuple(in_io_dtype(std::move(g.query), s.bf16_io),
                                  in_io_dtype(std::move(g.key), s.bf16_io),
                                  in_io_dtype(std::move(g.value), s.bf16_io));
          },
          py::arg("grad_output"));
}

}  // namespace

PYBIND11_MODULE(_headlight, m) {
  bind_gpt(m);
  bind_io(m);
  bind_load(m);
  bind_inspect(m);
  m.doc() = "headlight: multi-head attention kernels, a PyTorch-compatible module, head inspection";
  py::register_exception<Error>(m, "HeadlightError", PyExc_ValueError);

  bind_sdpa(m);
  bind_multihead_attention(m);
  m.def("cpu_info", [] {
    CpuInfo info = cpu_info();
    py::dict d;
    d["model_name"] = info.model_name;
    d["best_target"] = info.best_target;
    d["supported_targets"] = info.supported_targets;
    d["hardware_threads"] = info.hardware_threads;
    // The engine bf16 attention runs on here, as the kernels choose it per call (design.md).
    d["bf16_engine"] = amx_available() && amx_allowed()              ? "amx"
                       : cpu_has_bf16_dot() && native_bf16_allowed() ? "vdpbf16ps"
                                                                     : "widened";
    return d;
  });
}

}  // namespace headlight::python
