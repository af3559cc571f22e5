// Sentence embeddings (see headlight/load/embed.h).

#include "headlight/load/embed.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "headlight/core/error.h"

namespace headlight::load {

void pool(const Pooling& p, const float* h, int64_t T, int64_t C, float* out) {
  check(p.mode != Pooling::Mode::none,
        "pooling: the model has no pooling (not an embedding model)");
  if (p.mode == Pooling::Mode::cls) {
    std::copy(h, h + C, out);
  } else {
    for (int64_t j = 0; j < C; ++j) {
      double s = 0;
      for (int64_t t = 0; t < T; ++t) s += h[t * C + j];
      out[j] = static_cast<float>(s / static_cast<double>(T));
    }
  }
  if (p.normalize) {
    double n2 = 0;
    for (int64_t j = 0; j < C; ++j) n2 += static_cast<double>(out[j]) * out[j];
    // sentence-transformers divides by max(‖v‖, 1e-12).
    const double scale = 1.0 / std::max(std::sqrt(n2), 1e-12);
    for (int64_t j = 0; j < C; ++j) out[j] = static_cast<float>(out[j] * scale);
  }
}

std::vector<int32_t> embedding_tokens(const model::TextTokenizer& t, const std::string& text,
                                      int64_t max_len) {
  std::vector<int32_t> v = t.encode(text);
  if (static_cast<int64_t>(v.size()) > max_len) {
    const std::vector<int32_t> bare = t.encode(text, /*add_special_tokens=*/false);
    const size_t specials = v.size() - bare.size();
    size_t head = 0;  // special tokens before the text's own
    while (head < specials && !std::equal(bare.begin(), bare.end(), v.begin() + head)) ++head;
    const auto keep =
        static_cast<size_t>(std::max<int64_t>(0, max_len - static_cast<int64_t>(specials)));
    std::vector<int32_t> cut(v.begin(), v.begin() + static_cast<int64_t>(head));
    cut.insert(cut.end(), bare.begin(), bare.begin() + static_cast<int64_t>(keep));
    cut.insert(cut.end(), v.begin() + static_cast<int64_t>(head + bare.size()), v.end());
    v = std::move(cut);
  }
  check(!v.empty(), "text: no tokens");
  return v;
}

Tensor embed_texts(ThreadContext& ctx, Model& m, std::span<const std::string> texts,
                   const EmbedOptions& o) {
  check(m.pooling.mode != Pooling::Mode::none,
        "{}: the model has no pooling (an embedding model needs sentence-transformers' "
        "modules.json)",
        m.path);
  check(m.tokenizer.has_value(), "{}: the model has no tokenizer{}{}", m.path,
        m.tokenizer_error.empty() ? "" : ": ", m.tokenizer_error);
  check(o.batch_size > 0, "batch_size: must be positive, got {}", o.batch_size);
  const int64_t n = static_cast<int64_t>(texts.size()), C = m.net.config().n_embd;
  Tensor out = Tensor::zeros({n, C});
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    try {
      ids[static_cast<size_t>(i)] =
          embedding_tokens(*m.tokenizer, texts[static_cast<size_t>(i)], m.max_seq_length);
    } catch (const Error&) {
      fail("texts: text {} has no tokens", i);
    }
  }
  // Batches of up to batch_size texts in input order, packed end to end: every row is a token.
  std::vector<int32_t> rows;
  model::ForwardOptions f;
  f.inference = true;
  for (int64_t i = 0; i < n; i += o.batch_size) {
    const int64_t end = std::min(n, i + o.batch_size);
    rows.clear();
    f.lengths.clear();
    for (int64_t j = i; j < end; ++j) {
      const auto& v = ids[static_cast<size_t>(j)];
      rows.insert(rows.end(), v.begin(), v.end());
      f.lengths.push_back(static_cast<int64_t>(v.size()));
    }
    const float* h = m.net.forward(ctx, rows.data(), 1, static_cast<int64_t>(rows.size()), f);
    int64_t row0 = 0;
    for (int64_t j = i; j < end; ++j) {
      const int64_t t = f.lengths[static_cast<size_t>(j - i)];
      pool(m.pooling, h + row0 * C, t, C, out.data() + j * C);
      row0 += t;
    }
    if (o.progress) o.progress(end, n);
  }
  return out;
}

}  // namespace headlight::load
