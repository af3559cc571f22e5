// Bindings of the head inspection for attention computed elsewhere (a PyTorch model through
// headlight.torch.capture): headlight.head_roles and headlight.head_report. Thin: arguments in,
// the inspect/ and viz/ functions, Python objects out.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "conversions.h"
#include "gpt_bindings.h"
#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "headlight/inspect/analysis.h"
#include "headlight/inspect/capture.h"
#include "headlight/viz/report.h"

namespace headlight::python {

namespace py = pybind11;

namespace {

// probs as a C-contiguous float32 [n_layer, n_head, T, T] array (checked, naming it).
py::array_t<float, py::array::c_style | py::array::forcecast> probs_array(const py::handle& probs) {
  py::array a = as_float32(probs, "probs");
  check(a.ndim() == 4 && a.shape(2) == a.shape(3),
        "probs: expected [n_layer, n_head, T, T], got {} dims{}", a.ndim(),
        a.ndim() == 4 ? " with T × S not square" : "");
  return py::array_t<float, py::array::c_style | py::array::forcecast>(a);
}

// probs [n_layer, n_head, T, T] and the token texts (ids optional: 0…T−1) as a Capture.
inspect::Capture capture_of(const py::handle& probs, const std::vector<std::string>& token_text,
                            std::optional<std::vector<int32_t>> tokens) {
  const auto c = probs_array(probs);
  const int64_t L = c.shape(0), H = c.shape(1), T = c.shape(2);
  check(static_cast<int64_t>(token_text.size()) == T, "token_text: {} texts for {} tokens",
        token_text.size(), T);
  std::vector<int32_t> ids = tokens.value_or(std::vector<int32_t>{});
  if (!tokens)
    for (int64_t i = 0; i < T; ++i) ids.push_back(static_cast<int32_t>(i));
  std::vector<float> p(static_cast<size_t>(c.size()));
  std::memcpy(p.data(), c.data(), sizeof(float) * p.size());
  return inspect::capture_from_probs(std::move(ids), token_text, L, H, std::move(p));
}

}  // namespace

void bind_inspect(py::module_& m) {
  m.def(
      "head_roles",
      [](const py::object& probs, bool causal, int64_t repeated) {
        const int64_t T = probs_array(probs).shape(2);
        const inspect::Capture c = capture_of(probs, std::vector<std::string>(T), std::nullopt);
        return py::module_::import("json").attr("loads")(
            inspect::head_table_json(inspect::capture_head_table(c, causal, repeated)));
      },
      py::arg("probs"), py::arg("causal") = true, py::arg("repeated") = 0,
      "Role scores of every head from its attention probs [n_layer, n_head, T, T] (docs/heads.md): "
      "a list of {layer, head, role, scores, …}. With repeated=n the text was n tokens repeated "
      "twice, and previous_token and induction are scored too; what one text cannot give is None.");
  m.def(
      "head_report",
      [](const std::string& path, const py::object& probs,
         const std::vector<std::string>& token_text, std::optional<std::vector<int32_t>> tokens,
         bool causal, int64_t repeated, const std::string& title,
         const std::string& model_summary) {
        const inspect::Capture c = capture_of(probs, token_text, std::move(tokens));
        const auto rows = inspect::capture_head_table(c, causal, repeated);
        viz::ReportInput in;
        in.title = title;
        in.model_summary = model_summary;
        in.attention = inspect::to_json(c);
        in.heads = inspect::head_table_json(rows);
        AtomicFile out(path);
        viz::write_report(out, in);
      },
      py::arg("path"), py::arg("probs"), py::arg("token_text"), py::kw_only(),
      py::arg("tokens") = py::none(), py::arg("causal") = true, py::arg("repeated") = 0,
      py::arg("title") = "headlight: what each head does", py::arg("model_summary") = "",
      "Writes the HTML head report (the one `headlight explain` writes) of attention computed "
      "elsewhere: probs [n_layer, n_head, T, T], one text per token.");
}

}  // namespace headlight::python
