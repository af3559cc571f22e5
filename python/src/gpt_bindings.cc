// Python bindings of the GPT engine: headlight.GPT, headlight.Tokenizer, headlight.AdamW and the
// learning-rate schedule. Thin: argument conversion and the GIL; the logic is in C++.

#include "gpt_bindings.h"

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>

#include "conversions.h"
#include "gpt_calls.h"
#include "headlight/core/error.h"
#include "headlight/model/sampling.h"
#include "headlight/train/checkpoint.h"
#include "headlight/train/optimizer.h"

namespace headlight::python {

namespace py = pybind11;

namespace {

struct PyGPT {
  std::unique_ptr<model::GPT> model;
  std::optional<model::Tokenizer> tokenizer;  // none: the model works on token ids only
  ThreadContext ctx;
  PyGPT(std::unique_ptr<model::GPT> m, std::optional<model::Tokenizer> t, int threads)
      : model(std::move(m)), tokenizer(std::move(t)), ctx(threads) {}
};

// tokens and targets of the same [B, T] shape.
std::pair<py::array_t<int32_t, py::array::c_style | py::array::forcecast>,
          py::array_t<int32_t, py::array::c_style | py::array::forcecast>>
token_pair(const py::handle& tokens, const py::handle& targets, int64_t& batch, int64_t& seq) {
  int64_t b2, t2;
  auto x = token_array(tokens, "tokens", batch, seq);
  auto y = token_array(targets, "targets", b2, t2);
  check(batch == b2 && seq == t2, "targets: shape [{}, {}] differs from tokens [{}, {}]", b2, t2,
        batch, seq);
  return {std::move(x), std::move(y)};
}

py::dict config_dict(const model::GPTConfig& c) {
  return py::module_::import("json").attr("loads")(model::to_json(c));
}

model::GPTConfig config_from(const py::dict& d) {
  const std::string text = py::str(py::module_::import("json").attr("dumps")(d));
  return model::config_from_json(text);
}

// ---- GPT methods that do more than convert arguments.

py::array_t<float> gpt_forward(PyGPT& self, const py::object& tokens) {
  int64_t b, t;
  auto arr = token_array(tokens, "tokens", b, t);
  const float* logits;
  {
    py::gil_scoped_release release;
    logits = self.model->forward(self.ctx, arr.data(), b, t);
  }
  return copy_to_numpy(logits, {b, t, self.model->config().vocab_size});
}

py::tuple gpt_loss_and_grads(PyGPT& self, const py::object& tokens, const py::object& targets) {
  int64_t b, t;
  auto [x, y] = token_pair(tokens, targets, b, t);
  double loss;
  {
    py::gil_scoped_release release;
    self.model->zero_grads();
    loss = self.model->forward_backward(self.ctx, x.data(), y.data(), b, t);
  }
  return py::make_tuple(loss, named_arrays(*self.model, self.model->grads()));
}

double gpt_loss(PyGPT& self, const py::object& tokens, const py::object& targets) {
  int64_t b, t;
  auto [x, y] = token_pair(tokens, targets, b, t);
  py::gil_scoped_release release;
  return self.model->loss(self.ctx, x.data(), y.data(), b, t);
}

std::vector<int32_t> gpt_generate(PyGPT& self, const py::object& tokens, int64_t max_new_tokens,
                                  float temperature, std::optional<int64_t> top_k,
                                  std::optional<float> top_p, uint64_t seed) {
  return generate_from(self.ctx, *self.model, tokens, max_new_tokens,
                       {.temperature = temperature,
                        .top_k = top_k.value_or(0),
                        .top_p = top_p.value_or(1.0f),
                        .seed = seed});
}

// Checks every entry before writing any, so that a bad dict leaves the model unchanged.
void gpt_load_state_dict(PyGPT& self, const py::dict& d) {
  const auto& layout = self.model->layout();
  for (const auto& e : layout.entries())
    check(d.contains(e.name), "state_dict: missing \"{}\"", e.name);
  std::vector<std::pair<const model::ParameterEntry*, py::array_t<float>>> checked;
  for (const auto& [key, value] : d) {
    const std::string name = py::str(key);
    const auto* e = layout.find(name);
    check(e != nullptr, "state_dict: unexpected \"{}\"", name);
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(value);
    check(static_cast<bool>(a), "state_dict: \"{}\" is not an array", name);
    std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
    check(shape == e->shape, "state_dict: \"{}\" has shape {}, expected {}", name,
          shape_string(shape), shape_string(e->shape));
    checked.emplace_back(e, std::move(a));
  }
  for (const auto& [e, a] : checked)
    std::memcpy(self.model->params() + e->offset, a.data(),
                sizeof(float) * static_cast<size_t>(e->numel));
}

void bind_tokenizer(py::module_& m) {
  py::class_<model::Tokenizer>(m, "Tokenizer")
      .def_static("byte_level", &model::Tokenizer::byte_level)
      .def_static(
          "train_bpe",
          [](const py::object& text, int64_t vocab) {
            return model::Tokenizer::train_bpe(text_bytes(text), vocab);
          },
          py::arg("text"), py::arg("vocab_size"))
      .def_property_readonly("vocab_size", &model::Tokenizer::vocab_size)
      .def_property_readonly("is_bpe", &model::Tokenizer::is_bpe)
      .def(
          "encode",
          [](const model::Tokenizer& t, const py::object& text) {
            return t.encode(text_bytes(text));
          },
          py::arg("text"))
      .def(
          "decode_bytes",
          [](const model::Tokenizer& t, const std::vector<int32_t>& ids) {
            return py::bytes(t.decode(ids));
          },
          py::arg("tokens"))
      .def(
          "decode",
          [](const model::Tokenizer& t, const std::vector<int32_t>& ids) {
            return py::bytes(t.decode(ids)).attr("decode")("utf-8", "replace");
          },
          py::arg("tokens"));
}

void bind_gpt_model(py::module_& m) {
  py::class_<PyGPT> gpt_class(m, "GPT");
  gpt_class
      .def(py::init([](const py::dict& config, uint64_t seed, int threads) {
             auto gpt = std::make_unique<model::GPT>(config_from(config), seed);
             std::optional<model::Tokenizer> tok;
             if (gpt->config().vocab_size >= 256) tok = model::Tokenizer::byte_level();
             return std::make_unique<PyGPT>(std::move(gpt), std::move(tok), threads);
           }),
           py::arg("config"), py::arg("seed") = 0, py::kw_only(), py::arg("threads") = 0)
      .def_static(
          "load",
          [](const std::string& path, int threads) {
            train::LoadedModel loaded = train::load_model(path);
            return std::make_unique<PyGPT>(std::make_unique<model::GPT>(std::move(loaded.model)),
                                           std::move(loaded.tokenizer), threads);
          },
          py::arg("path"), py::kw_only(), py::arg("threads") = 0)
      .def(
          "save",
          [](PyGPT& self, const std::string& path) {
            train::save_model(path, *self.model, self.tokenizer ? &*self.tokenizer : nullptr);
          },
          py::arg("path"))
      .def_property_readonly("config",
                             [](const PyGPT& self) { return config_dict(self.model->config()); })
      .def_property(
          "tokenizer", [](const PyGPT& self) { return self.tokenizer; },
          [](PyGPT& self, const std::optional<model::Tokenizer>& t) {
            check(!t || t->vocab_size() <= self.model->config().vocab_size,
                  "tokenizer: {} tokens do not fit the model's vocab_size {}",
                  t ? t->vocab_size() : 0, self.model->config().vocab_size);
            self.tokenizer = t;
          })
      .def("forward", &gpt_forward, py::arg("tokens"))
      .def("loss_and_grads", &gpt_loss_and_grads, py::arg("tokens"), py::arg("targets"))
      .def("loss", &gpt_loss, py::arg("tokens"), py::arg("targets"))
      .def("generate", &gpt_generate, py::arg("tokens"), py::arg("max_new_tokens"),
           py::arg("temperature") = 1.0f, py::arg("top_k") = py::none(),
           py::arg("top_p") = py::none(), py::arg("seed") = 0)
      .def("state_dict",
           [](const PyGPT& self) { return named_arrays(*self.model, self.model->params()); })
      .def("load_state_dict", &gpt_load_state_dict, py::arg("state_dict"))
      .def_property(
          "gates",
          [](const PyGPT& self) {
            const auto& c = self.model->config();
            return gates_to_numpy(self.model->gates(), false, {c.n_layer, c.n_head});
          },
          [](PyGPT& self, const py::object& g) {
            const auto& c = self.model->config();
            set_gates(self.model->gates(), g, {c.n_layer, c.n_head}, "gates");
          })
      .def_property_readonly(
          "gate_grads",
          [](const PyGPT& self) {
            const auto& c = self.model->config();
            return gates_to_numpy(self.model->gates(), true, {c.n_layer, c.n_head});
          })
      .def(
          "clip_grad_norm",
          [](PyGPT& self, double max_norm) {
            return train::clip_grad_norm(self.ctx, self.model->grads(),
                                         self.model->layout().total(), max_norm);
          },
          py::arg("max_norm"));
  bind_head_calls(gpt_class, [](PyGPT& self) { return std::pair{&self.ctx, self.model.get()}; });
}

void bind_optimizer(py::module_& m) {
  py::class_<train::AdamW>(m, "AdamW")
      .def(py::init([](PyGPT& model, std::pair<float, float> betas, float eps, float weight_decay) {
             return std::make_unique<train::AdamW>(
                 model.model->layout(), train::AdamWConfig{.beta1 = betas.first,
                                                           .beta2 = betas.second,
                                                           .eps = eps,
                                                           .weight_decay = weight_decay});
           }),
           py::arg("model"), py::kw_only(), py::arg("betas") = std::make_pair(0.9f, 0.95f),
           py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.1f)
      .def(
          "step",
          [](train::AdamW& opt, PyGPT& model, float lr) {
            opt.step(model.ctx, model.model->params(), model.model->grads(), lr);
          },
          py::arg("model"), py::arg("lr"))
      .def_property_readonly("steps", &train::AdamW::steps);

  m.def(
      "lr_at",
      [](int64_t step, float lr, float min_lr, int64_t warmup, int64_t total) {
        return train::LrSchedule{.lr = lr, .min_lr = min_lr, .warmup = warmup, .total = total}.at(
            step);
      },
      py::arg("step"), py::arg("lr"), py::arg("min_lr"), py::arg("warmup"), py::arg("total"));
}

}  // namespace

void bind_gpt(py::module_& m) {
  bind_tokenizer(m);
  bind_gpt_model(m);
  bind_optimizer(m);
}

}  // namespace headlight::python
