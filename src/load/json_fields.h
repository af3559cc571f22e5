// Reading a model's JSON files (config.json, tokenizer_config.json, …) with errors that name the
// file and the field.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "headlight/core/error.h"

namespace headlight::load {

// The parsed text of a JSON file that must hold an object; `what` names it in errors.
nlohmann::json parse_json_object(const std::string& text, const std::string& what);
// The same, read from `path` (an Error naming it when it cannot be read).
nlohmann::json read_json_object(const std::string& path);

class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string what) : j_(j), what_(std::move(what)) {}
  // Present and not null.
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  // A required positive integer.
  int64_t size(const char* key) const;
  int64_t integer(const char* key, int64_t fallback) const;
  double number(const char* key, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key, const std::string& fallback) const;
  const nlohmann::json& at(const char* key) const { return j_.at(key); }
  const std::string& what() const { return what_; }

 private:
  const nlohmann::json& j_;
  std::string what_;
};

}  // namespace headlight::load
