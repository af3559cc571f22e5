// The parameters of a GPT as one arena with named views (llm.c style): parameters, gradients and
// the optimizer's moments each use the same layout, so zeroing the gradients is one memset and an
// optimizer step one loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headlight/core/tensor.h"
#include "headlight/model/config.h"

namespace headlight::model {

struct ParameterEntry {
  std::string name;  // checkpoint name (docs/design.md §2, nanoGPT layout)
  Shape shape;
  int64_t offset = 0;  // in floats, from the start of the arena
  int64_t numel = 0;
  bool decay = false;  // weight decay applies (matrices of the linear layers; not biases, norms,
                       // embeddings)
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const GPTConfig& c);
  const std::vector<ParameterEntry>& entries() const { return entries_; }
  int64_t total() const { return total_; }
  // The entry of `name`; throws Error naming it when the model has no such parameter.
  const ParameterEntry& at(const std::string& name) const;
  const ParameterEntry* find(const std::string& name) const;

 private:
  void add(std::string name, Shape shape, bool decay);
  std::vector<ParameterEntry> entries_;
  int64_t total_ = 0;
};

// Offsets (in floats) of one transformer block's parameters within the arena; −1 when absent.
struct BlockOffsets {
  int64_t ln1_w = -1, ln1_b = -1, attn_w = -1, attn_b = -1, proj_w = -1, proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, fc_proj_w = -1, fc_proj_b = -1;
};
struct ModelOffsets {
  int64_t wte = -1, wpe = -1, wtt = -1, lne_w = -1, lne_b = -1, lnf_w = -1, lnf_b = -1;
  int64_t lm_head = -1;
  std::vector<BlockOffsets> blocks;
};
ModelOffsets model_offsets(const GPTConfig& c, const ParameterLayout& layout);

}  // namespace headlight::model
