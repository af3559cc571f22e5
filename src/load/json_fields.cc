// JsonFields (see json_fields.h).

#include "src/load/json_fields.h"

#include "headlight/core/read_file.h"

namespace headlight::load {

nlohmann::json parse_json_object(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", what, e.what());
  }
  check(j.is_object(), "{}: expected a JSON object, got {}", what, j.type_name());
  return j;
}

nlohmann::json read_json_object(const std::string& path) {
  return parse_json_object(read_file(path), path);
}

int64_t JsonFields::size(const char* key) const {
  check(has(key), "{}: missing \"{}\"", what_, key);
  const int64_t v = integer(key, 0);
  check(v > 0, "{}: \"{}\" must be a positive integer, got {}", what_, key, v);
  return v;
}

int64_t JsonFields::integer(const char* key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  check(v.is_number_integer(), "{}: \"{}\" must be an integer, got {}", what_, key, v.dump());
  return v.get<int64_t>();
}

double JsonFields::number(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  check(v.is_number(), "{}: \"{}\" must be a number, got {}", what_, key, v.dump());
  return v.get<double>();
}

bool JsonFields::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  check(v.is_boolean(), "{}: \"{}\" must be true or false, got {}", what_, key, v.dump());
  return v.get<bool>();
}

std::string JsonFields::string(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  check(v.is_string(), "{}: \"{}\" must be a string, got {}", what_, key, v.dump());
  return v.get<std::string>();
}

}  // namespace headlight::load
