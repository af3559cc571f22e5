// Shared parts of the Hugging Face tokenizer readers (see hf_tokenizer.h).

#include "src/model/hf_tokenizer.h"

#include "headlight/core/error.h"

namespace headlight::model::hf {

using json = nlohmann::json;

json parse(const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not JSON ({})", what, e.what());
  }
}

int32_t token_id(const json& j, const std::string& what) {
  check(j.is_number_integer() && j.get<int64_t>() >= 0 && j.get<int64_t>() < (int64_t{1} << 31),
        "{}: a token id must be a non-negative integer, got {}", what, j.dump());
  return j.get<int32_t>();
}

void template_tokens(const json& post, const std::function<int32_t(const std::string&)>& id_of,
                     const std::string& what, std::vector<int32_t>& prefix,
                     std::vector<int32_t>& suffix) {
  auto known = [&](const std::string& tok) {
    const int32_t id = id_of(tok);
    check(id >= 0, "{}: post_processor token \"{}\" is not in the vocabulary", what, tok);
    return id;
  };
  if (post.is_null()) return;
  const std::string type = post.is_object() ? post.value("type", "") : "";
  if (type == "BertProcessing") {
    check(post.contains("cls") && post.contains("sep"), "{}: BertProcessing needs cls and sep",
          what);
    prefix.push_back(known(post["cls"].at(0).get<std::string>()));
    suffix.push_back(known(post["sep"].at(0).get<std::string>()));
    return;
  }
  const json* single = nullptr;
  if (type == "TemplateProcessing") {
    single = &post["single"];
  } else if (type == "Sequence") {
    for (const json& p : post.value("processors", json::array())) {
      if (p.value("type", "") == "TemplateProcessing") {
        single = &p["single"];
      } else {
        check(p.value("type", "") == "ByteLevel", "{}: post_processor {} is not supported", what,
              p.value("type", "?"));
      }
    }
    if (!single) return;
  } else {
    fail("{}: post_processor {} is not supported", what, type.empty() ? post.dump() : type);
  }
  bool seen_sequence = false;
  for (const json& piece : *single) {
    if (piece.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    check(piece.contains("SpecialToken") && piece["SpecialToken"].contains("id"),
          "{}: post_processor.single has an entry of neither kind", what);
    (seen_sequence ? suffix : prefix)
        .push_back(known(piece["SpecialToken"]["id"].get<std::string>()));
  }
}

void split_added(std::string_view text, const std::vector<std::string>& tokens,
                 const std::function<void(std::string_view)>& plain,
                 const std::function<void(size_t)>& added) {
  size_t start = 0, at = 0;
  while (at < text.size()) {
    size_t best = tokens.size();
    for (size_t k = 0; k < tokens.size(); ++k)
      if (text.compare(at, tokens[k].size(), tokens[k]) == 0 &&
          (best == tokens.size() || tokens[k].size() > tokens[best].size()))
        best = k;
    if (best == tokens.size()) {
      ++at;
      continue;
    }
    if (at > start) plain(text.substr(start, at - start));
    added(best);
    at += tokens[best].size();
    start = at;
  }
  if (start < text.size()) plain(text.substr(start));
}

}  // namespace headlight::model::hf
