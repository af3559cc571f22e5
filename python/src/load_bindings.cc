// Bindings of real models: headlight.load(path) → headlight.Model (a headlight checkpoint, a
// Hugging Face folder or a GGUF file) with its tokenizer (headlight.TextTokenizer). Thin:
// argument conversion and the GIL; the logic is in load/ and model/.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "conversions.h"
#include "gpt_bindings.h"
#include "gpt_calls.h"
#include "headlight/core/error.h"
#include "headlight/inspect/coreference.h"
#include "headlight/load/chat.h"
#include "headlight/load/embed.h"
#include "headlight/load/model.h"
#include "headlight/model/sampling.h"

namespace headlight::python {

namespace py = pybind11;

namespace {

struct PyModel {
  load::Model m;
  ThreadContext ctx;
  PyModel(load::Model model, int threads) : m(std::move(model)), ctx(threads) {}

  const model::TextTokenizer& tokenizer() const {
    check(m.tokenizer.has_value(), "{}: the model has no tokenizer{}{}", m.path,
          m.tokenizer_error.empty() ? "" : ": ", m.tokenizer_error);
    return *m.tokenizer;
  }
};

py::dict model_config(const PyModel& self) {
  py::dict d = py::module_::import("json").attr("loads")(model::to_json(self.m.net.config()));
  d["architecture"] = self.m.architecture;
  d["format"] = load::format_name(self.m.format);
  d["pooling"] = load::pooling_name(self.m.pooling.mode);
  d["normalize"] = self.m.pooling.normalize;
  d["max_seq_length"] = self.m.max_seq_length;
  d["eos_token_ids"] = self.m.eos_ids;
  return d;
}

// The inputs of a forward: tokens [B, T], optional token types of the same shape (kept alive
// here) and optional packed-sequence lengths.
struct Inputs {
  int64_t b = 0, t = 0;
  TokenArray tokens, types;
  model::ForwardOptions options;
  Inputs(const py::object& ids, const py::object& token_types,
         const std::optional<std::vector<int64_t>>& lengths) {
    tokens = token_array(ids, "tokens", b, t);
    if (!token_types.is_none()) {
      int64_t b2, t2;
      types = token_array(token_types, "token_types", b2, t2);
      check(b2 == b && t2 == t, "token_types: shape [{}, {}] differs from tokens [{}, {}]", b2, t2,
            b, t);
      options.token_types = types.data();
    }
    if (lengths) options.lengths = *lengths;
  }
};

py::array_t<float> model_forward(PyModel& self, const py::object& tokens,
                                 const py::object& token_types,
                                 const std::optional<std::vector<int64_t>>& lengths) {
  Inputs in(tokens, token_types, lengths);
  const int64_t b = in.b, t = in.t;
  in.options.inference = true;
  const float* out;
  {
    py::gil_scoped_release release;
    out = self.m.net.forward(self.ctx, in.tokens.data(), b, t, in.options);
  }
  return copy_to_numpy(out, {b, t, self.m.net.config().output_width()});
}

std::vector<int32_t> model_generate(PyModel& self, const py::object& tokens, int64_t max_new_tokens,
                                    float temperature, std::optional<int64_t> top_k,
                                    std::optional<float> top_p, uint64_t seed, bool stop_at_eos) {
  model::SamplingOptions o{.temperature = temperature,
                           .top_k = top_k.value_or(0),
                           .top_p = top_p.value_or(1.0f),
                           .seed = seed};
  if (stop_at_eos) o.stop_tokens = self.m.eos_ids;
  return generate_from(self.ctx, self.m.net, tokens, max_new_tokens, o);
}

// The forward, then the backward from doutput (the gradient of the forward's output: logits, or
// hidden states without an LM head); the parameter gradients by headlight name.
py::dict model_backward(PyModel& self, const py::object& tokens, const py::object& doutput,
                        const py::object& token_types,
                        const std::optional<std::vector<int64_t>>& lengths) {
  Inputs in(tokens, token_types, lengths);
  const int64_t b = in.b, t = in.t;
  const int64_t w = self.m.net.config().output_width();
  auto g = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(
      as_float32(doutput, "doutput"));
  std::vector<int64_t> shape(g.shape(), g.shape() + g.ndim());
  check(shape == std::vector<int64_t>{b, t, w}, "doutput: expected shape [{}, {}, {}], got {}", b,
        t, w, shape_string(shape));
  {
    py::gil_scoped_release release;
    self.m.net.zero_grads();
    self.m.net.forward(self.ctx, in.tokens.data(), b, t, in.options);
    self.m.net.backward(self.ctx, in.tokens.data(), g.data(), in.options);
  }
  return named_arrays(self.m.net, self.m.net.grads());
}

py::array model_encode(PyModel& self, const std::vector<std::string>& texts, int64_t batch_size) {
  Tensor out;
  {
    py::gil_scoped_release release;
    out = load::embed_texts(self.ctx, self.m, texts, {.batch_size = batch_size});
  }
  return to_numpy(std::move(out));
}

}  // namespace

void bind_load(py::module_& m) {
  py::class_<model::TextTokenizer>(m, "TextTokenizer")
      .def_property_readonly("kind", &model::TextTokenizer::kind)
      .def_property_readonly("vocab_size", &model::TextTokenizer::vocab_size)
      .def(
          "encode",
          [](const model::TextTokenizer& t, const py::object& text, bool add_special_tokens) {
            return t.encode(text_bytes(text), add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens") = true)
      .def(
          "decode",
          [](const model::TextTokenizer& t, const std::vector<int32_t>& ids,
             bool skip_special_tokens) {
            return py::bytes(t.decode(ids, skip_special_tokens)).attr("decode")("utf-8", "replace");
          },
          py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def(
          "token", [](const model::TextTokenizer& t, int32_t id) { return py::bytes(t.token(id)); },
          py::arg("id"))
      .def(
          "token_bytes",
          [](const model::TextTokenizer& t, int32_t id) { return py::bytes(t.token_bytes(id)); },
          py::arg("id"))
      .def_property_readonly("lossless", &model::TextTokenizer::lossless)
      .def("id", &model::TextTokenizer::id, py::arg("token"));

  py::class_<PyModel> model_class(m, "Model");
  model_class.def_property_readonly("config", &model_config)
      .def_property_readonly("path", [](const PyModel& self) { return self.m.path; })
      .def_property_readonly(
          "tokenizer",
          [](const PyModel& self) -> const model::TextTokenizer& { return self.tokenizer(); },
          py::return_value_policy::reference_internal)
      .def_property_readonly("chat_template",
                             [](const PyModel& self) { return self.m.chat_template; })
      .def_property_readonly(
          "stored_dtypes",
          [](const PyModel& self) {
            py::dict d;  // in order of first appearance
            for (const auto& [type, n] : self.m.stored_dtypes) d[py::str(type)] = n;
            return d;
          },
          "The parameters' element counts by their type in the files ('BF16', 'Q4_K', 'F32', …), "
          "before they were read as float32.")
      .def("forward", &model_forward, py::arg("tokens"), py::arg("token_types") = py::none(),
           py::arg("lengths") = py::none())
      .def("generate", &model_generate, py::arg("tokens"), py::arg("max_new_tokens"),
           py::arg("temperature") = 1.0f, py::arg("top_k") = py::none(),
           py::arg("top_p") = py::none(), py::arg("seed") = 0, py::arg("stop_at_eos") = true)
      .def(
          "apply_chat_template",
          [](const PyModel& self, const std::vector<std::map<std::string, std::string>>& messages,
             bool add_generation_prompt) {
            std::vector<load::ChatMessage> ms;
            for (const auto& d : messages) {
              check(d.count("role") == 1 && d.count("content") == 1,
                    "messages: each message needs \"role\" and \"content\"");
              ms.push_back({d.at("role"), d.at("content")});
            }
            return load::chat_prompt(self.m, ms, add_generation_prompt);
          },
          py::arg("messages"), py::arg("add_generation_prompt") = true)
      .def(
          "coreference",
          [](PyModel& self, const std::string& path) {
            const auto passages = inspect::read_coreference_passages(path);
            inspect::CorefResult r;
            {
              py::gil_scoped_release release;
              r = inspect::natural_coreference(self.ctx, self.m.net, self.tokenizer(), passages);
            }
            const auto& c = self.m.net.config();
            py::array_t<double> acc({c.n_layer, c.n_head});
            std::copy(r.accuracy.begin(), r.accuracy.end(), acc.mutable_data());
            py::dict out;
            out["passages"] = r.passages;
            out["accuracy"] = acc;
            out["nearest_name_accuracy"] = r.nearest_name_accuracy;
            return out;
          },
          py::arg("path"))
      .def("encode", &model_encode, py::arg("texts"), py::arg("batch_size") = 32)
      .def("backward", &model_backward, py::arg("tokens"), py::arg("doutput"),
           py::arg("token_types") = py::none(), py::arg("lengths") = py::none())
      .def("state_dict",
           [](const PyModel& self) { return named_arrays(self.m.net, self.m.net.params()); });
  bind_head_calls(model_class, [](PyModel& self) { return std::pair{&self.ctx, &self.m.net}; });

  m.def(
      "load",
      [](const std::string& path, int threads) {
        std::unique_ptr<PyModel> out;
        {
          py::gil_scoped_release release;
          out = std::make_unique<PyModel>(load::load_model(path), threads);
        }
        return out;
      },
      py::arg("path"), py::kw_only(), py::arg("threads") = 0);
}

}  // namespace headlight::python
