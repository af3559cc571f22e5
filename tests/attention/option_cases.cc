// The sweep of attention options shared by the reference and kernel tests.

#include <limits>

#include "attention_test_util.h"

namespace headlight::attention::testing {

std::vector<OptionCase> option_cases() {
  std::vector<OptionCase> cases;
  auto add = [&](std::string name, AttentionShape s, std::function<void(CaseData&)> f) {
    cases.push_back({std::move(name), s, std::move(f)});
  };
  const float inf = std::numeric_limits<float>::infinity();
  add("plain",
      {.batch = 2,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 5,
       .len_kv = 7,
       .head_dim = 4,
       .value_dim = 4},
      [](CaseData&) {});
  add("custom_scale_and_value_dim",
      {.batch = 1,
       .heads = 3,
       .kv_heads = 3,
       .len_q = 4,
       .len_kv = 6,
       .head_dim = 5,
       .value_dim = 3},
      [](CaseData& d) { d.options.scale = 0.7f; });
  add("causal_top_left",
      {.batch = 1,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 6,
       .len_kv = 6,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) { d.options.causal = true; });
  add("causal_top_left_lq_lt_lk",
      {.batch = 1,
       .heads = 1,
       .kv_heads = 1,
       .len_q = 3,
       .len_kv = 7,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) { d.options.causal = true; });
  add("causal_bottom_right",
      {.batch = 2,
       .heads = 1,
       .kv_heads = 1,
       .len_q = 3,
       .len_kv = 7,
       .head_dim = 3,
       .value_dim = 2},
      [](CaseData& d) {
        d.options.causal = true;
        d.options.alignment = Alignment::bottom_right;
      });
  add("sliding_window",
      {.batch = 1,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 8,
       .len_kv = 8,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.options.window_left = 2;
        d.options.window_right = 1;
      });
  add("window_and_causal_bottom_right",
      {.batch = 1,
       .heads = 1,
       .kv_heads = 1,
       .len_q = 4,
       .len_kv = 9,
       .head_dim = 2,
       .value_dim = 2},
      [](CaseData& d) {
        d.options.causal = true;
        d.options.alignment = Alignment::bottom_right;
        d.options.window_left = 3;
      });
  add("key_lengths",
      {.batch = 3,
       .heads = 2,
       .kv_heads = 1,
       .len_q = 4,
       .len_kv = 6,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.lengths = {6, 2, 0};  // batch 2 has no keys at all
        d.options.key_lengths = d.lengths.data();
      });
  add("bool_mask_per_head",
      {.batch = 2,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 4,
       .len_kv = 5,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.bool_mask.resize(2 * 2 * 4 * 5);
        for (size_t i = 0; i < d.bool_mask.size(); ++i) d.bool_mask[i] = (i * 7 + 3) % 4 != 0;
        d.options.mask = {.kind = MaskKind::boolean,
                          .data = d.bool_mask.data(),
                          .batch_stride = 2 * 4 * 5,
                          .head_stride = 4 * 5,
                          .row_stride = 5};
      });
  add("bool_mask_broadcast_over_batch_and_heads",
      {.batch = 2,
       .heads = 3,
       .kv_heads = 3,
       .len_q = 4,
       .len_kv = 5,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.bool_mask.resize(4 * 5);
        for (size_t i = 0; i < d.bool_mask.size(); ++i) d.bool_mask[i] = (i * 5 + 1) % 3 != 0;
        d.options.mask = {.kind = MaskKind::boolean,
                          .data = d.bool_mask.data(),
                          .batch_stride = 0,
                          .head_stride = 0,
                          .row_stride = 5};
      });
  add("additive_mask_with_minus_inf",
      {.batch = 1,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 4,
       .len_kv = 5,
       .head_dim = 3,
       .value_dim = 3},
      [inf](CaseData& d) {
        d.float_mask.resize(2 * 4 * 5);
        for (size_t i = 0; i < d.float_mask.size(); ++i)
          d.float_mask[i] = i % 6 == 0 ? -inf : 0.3f * static_cast<float>(i % 5) - 0.6f;
        d.options.mask = {.kind = MaskKind::additive,
                          .data = d.float_mask.data(),
                          .batch_stride = 0,
                          .head_stride = 4 * 5,
                          .row_stride = 5};
      });
  add("alibi",
      {.batch = 1,
       .heads = 4,
       .kv_heads = 4,
       .len_q = 5,
       .len_kv = 5,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
        d.options.alibi_slopes = d.slopes.data();
        d.options.causal = true;
      });
  add("alibi_bidirectional_bottom_right",
      {.batch = 1,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 3,
       .len_kv = 6,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.slopes = {0.3f, 0.7f};
        d.options.alibi_slopes = d.slopes.data();
        d.options.alignment = Alignment::bottom_right;
      });
  add("softcap",
      {.batch = 1,
       .heads = 2,
       .kv_heads = 2,
       .len_q = 4,
       .len_kv = 5,
       .head_dim = 8,
       .value_dim = 4},
      [](CaseData& d) {
        d.options.softcap = 0.5f;
        d.options.scale = 2.0f;
      });
  add("gqa",
      {.batch = 2,
       .heads = 6,
       .kv_heads = 2,
       .len_q = 3,
       .len_kv = 4,
       .head_dim = 3,
       .value_dim = 2},
      [](CaseData& d) { d.options.causal = true; });
  add("mqa",
      {.batch = 1,
       .heads = 4,
       .kv_heads = 1,
       .len_q = 3,
       .len_kv = 5,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData&) {});
  add("dropout",
      {.batch = 2,
       .heads = 2,
       .kv_heads = 1,
       .len_q = 4,
       .len_kv = 5,
       .head_dim = 3,
       .value_dim = 3},
      [](CaseData& d) {
        d.options.dropout_p = 0.3f;
        d.options.dropout_seed = 99;
      });
  add("everything",
      {.batch = 2,
       .heads = 4,
       .kv_heads = 2,
       .len_q = 5,
       .len_kv = 7,
       .head_dim = 4,
       .value_dim = 3},
      [](CaseData& d) {
        AttentionOptions& o = d.options;
        o.causal = true;
        o.alignment = Alignment::bottom_right;
        o.window_left = 4;
        d.lengths = {7, 5};
        o.key_lengths = d.lengths.data();
        d.slopes = {0.1f, 0.2f, 0.3f, 0.4f};
        o.alibi_slopes = d.slopes.data();
        o.softcap = 3.0f;
        d.bool_mask.resize(5 * 7);
        for (size_t i = 0; i < d.bool_mask.size(); ++i) d.bool_mask[i] = i % 5 != 1;
        o.mask = {.kind = MaskKind::boolean,
                  .data = d.bool_mask.data(),
                  .batch_stride = 0,
                  .head_stride = 0,
                  .row_stride = 7};
        o.dropout_p = 0.2f;
        o.dropout_seed = 5;
      });
  return cases;
}

}  // namespace headlight::attention::testing
