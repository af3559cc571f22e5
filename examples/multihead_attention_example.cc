// The C++ example of the README: PyTorch-style multi-head self-attention with headlight.
#include <cstdio>

#include "headlight/attention/multihead_attention.h"
#include "headlight/attention/sdpa.h"

int main() {
  using namespace headlight;
  ThreadContext ctx(2);  // threads are passed in, never global

  // torch.nn.MultiheadAttention(embed_dim=64, num_heads=8, batch_first=True), 2 key/value heads.
  const attention::MultiheadAttentionConfig config{
      .embed_dim = 64, .num_heads = 8, .batch_first = true, .num_kv_heads = 2};
  attention::MultiheadAttention mha(config, /*seed=*/0);

  Tensor x = Tensor::zeros({1, 10, 64});  // (batch, length, embed_dim)
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = 0.01f * static_cast<float>(i % 97);
  const attention::MhaForwardOptions options{.average_attn_weights = false, .is_causal = true};
  attention::MhaOutput out = mha.forward(ctx, x.view(), x.view(), x.view(), options);
  std::printf("output %s, weights %s\n", shape_string(out.output.shape()).c_str(),
              shape_string(out.weights.shape()).c_str());  // [1, 10, 64], [1, 8, 10, 10]

  // Gradients: of the inputs returned, of the parameters in mha.grad(name).
  attention::MhaInputGrads grads = mha.backward(ctx, out.output.view());
  std::printf("d in_proj_weight %s, d query %s\n",
              shape_string(mha.grad("in_proj_weight").shape()).c_str(),
              shape_string(grads.query.shape()).c_str());

  // The functional form: torch.nn.functional.scaled_dot_product_attention.
  Tensor q = Tensor::zeros({2, 8, 16, 32}), kv = Tensor::zeros({2, 8, 16, 32});
  const attention::SdpaOptions sdpa{.is_causal = true};
  Tensor o = attention::scaled_dot_product_attention(ctx, q.view(), kv.view(), kv.view(), sdpa);
  std::printf("sdpa output %s\n", shape_string(o.shape()).c_str());
  return 0;
}
