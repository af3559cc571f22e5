// Unicode helpers through utf8proc (see unicode.h).

#include "src/model/unicode.h"

#include <utf8proc.h>

namespace headlight::model::unicode {

namespace {

// The length of the valid UTF-8 sequence at p[0, n), or the length of its maximal invalid subpart
// (at least 1) negated: Unicode's "best practice" for U+FFFD substitution (Table 3-7's ranges).
int sequence(const uint8_t* p, size_t n) {
  const uint8_t b = p[0];
  if (b < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;
    const uint8_t c = p[k];
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -k;
  }
  return need + 1;
}

}  // namespace

std::vector<char32_t> decode(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    const int len = sequence(p + i, text.size() - i);
    if (len < 0) {
      out.push_back(0xFFFD);
      i += static_cast<size_t>(-len);
      continue;
    }
    utf8proc_int32_t c = 0;
    utf8proc_iterate(p + i, len, &c);
    out.push_back(static_cast<char32_t>(c));
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string lossy(std::string_view bytes) {
  return encode(decode(bytes));
}

void append(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string encode(const std::vector<char32_t>& chars) {
  std::string out;
  out.reserve(chars.size());
  for (char32_t c : chars) append(out, c);
  return out;
}

Category category(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return Category::letter;
    case UTF8PROC_CATEGORY_MN:
      return Category::mark_nonspacing;
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
      return Category::mark_other;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return Category::number;
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return Category::punctuation;
    case UTF8PROC_CATEGORY_SM:
    case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
      return Category::symbol;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return Category::separator;
    case UTF8PROC_CATEGORY_CC:
      return Category::control;
    case UTF8PROC_CATEGORY_CF:
      return Category::format;
    default:  // Cs, Co, Cn
      return Category::other;
  }
}

bool is_punctuation(char32_t c) {
  return category(c) == Category::punctuation;
}

bool is_other(char32_t c) {
  const Category k = category(c);
  return k == Category::control || k == Category::format || k == Category::other;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x85 || category(c) == Category::separator;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  utf8proc_int32_t buf[32];
  int last_boundclass = 0;
  const utf8proc_ssize_t n =
      utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 32,
                              static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE), &last_boundclass);
  if (n <= 0 || n > 32) {
    out.push_back(c);
    return;
  }
  for (utf8proc_ssize_t i = 0; i < n; ++i) out.push_back(static_cast<char32_t>(buf[i]));
}

void lowercase(char32_t c, std::vector<char32_t>& out) {
  if (c == 0x130) {  // the one unconditional lowercase mapping to two code points: İ → i̇
    out.push_back(U'i');
    out.push_back(0x307);
    return;
  }
  out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

}  // namespace headlight::model::unicode
