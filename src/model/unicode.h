// Unicode for the tokenizers, through utf8proc (Debian's libutf8proc): UTF-8 decoding and encoding,
// general categories, canonical decomposition (NFD) and lowercase.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace headlight::model::unicode {

// The code points of `text`; each maximal invalid subsequence becomes one U+FFFD (as Rust's
// String::from_utf8_lossy, and so Hugging Face tokenizers, decode bytes).
std::vector<char32_t> decode(std::string_view text);
// `bytes` as valid UTF-8, invalid subsequences replaced likewise.
std::string lossy(std::string_view bytes);
// Appends the UTF-8 bytes of `c` to `out`.
void append(std::string& out, char32_t c);
std::string encode(const std::vector<char32_t>& chars);

enum class Category : uint8_t {
  letter,
  mark_nonspacing,
  mark_other,
  number,
  punctuation,
  symbol,
  separator,
  control,
  format,
  other
};
Category category(char32_t c);
bool is_punctuation(char32_t c);  // general category P* (Pc, Pd, Ps, Pe, Pi, Pf, Po)
bool is_other(char32_t c);        // general category C* (Cc, Cf, Cs, Co, Cn)
// The White_Space property (as Rust's char::is_whitespace): Zs, Zl, Zp, U+0009–U+000D, U+0085.
bool is_whitespace(char32_t c);
// The canonical decomposition (NFD) of one code point, appended to `out`.
void decompose(char32_t c, std::vector<char32_t>& out);
// Full lowercase mapping (as Rust's char::to_lowercase), appended to `out`.
void lowercase(char32_t c, std::vector<char32_t>& out);

}  // namespace headlight::model::unicode
