// What the tokenizers read from a Hugging Face tokenizer.json share: the JSON text parsed with the
// file named in errors, token ids checked, the post-processor's template, and splitting the added
// tokens out of the raw text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace headlight::model::hf {

// The parsed tokenizer.json; an Error naming `what` when it is not JSON.
nlohmann::json parse(const std::string& text, const std::string& what);

// A token id: a non-negative 32-bit integer.
int32_t token_id(const nlohmann::json& j, const std::string& what);

// The tokens a post_processor puts before and after a single sequence: TemplateProcessing's
// "single" (alone or inside a Sequence of processors) or BertProcessing's cls/sep. `id_of` maps a
// token to its id (−1: absent, an Error naming it). A null post-processor adds nothing.
void template_tokens(const nlohmann::json& post,
                     const std::function<int32_t(const std::string&)>& id_of,
                     const std::string& what, std::vector<int32_t>& prefix,
                     std::vector<int32_t>& suffix);

// Splits `text` at the added tokens (at each position the longest that starts there, at the
// leftmost position where any does): plain(segment) for the text between, added(index into
// `tokens`) for each match, in order.
void split_added(std::string_view text, const std::vector<std::string>& tokens,
                 const std::function<void(std::string_view)>& plain,
                 const std::function<void(size_t)>& added);

}  // namespace headlight::model::hf
