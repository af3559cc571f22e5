// Chat templates recognised by their text (see headlight/load/chat.h).

#include "headlight/load/chat.h"

#include "headlight/core/error.h"
#include "headlight/load/model.h"

namespace headlight::load {

namespace {

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

ChatTemplate ChatTemplate::recognise(const std::string& jinja, const std::string& what) {
  check(!jinja.empty(), "{}: the model has no chat template", what);
  ChatTemplate t;
  const bool chatml = contains(jinja,
                               "'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                               "'<|im_end|>' + '\n'") &&
                      contains(jinja, "'<|im_start|>assistant\n'") && !contains(jinja, "tool");
  const bool llama3 = contains(jinja,
                               "'<|start_header_id|>' + message['role'] + "
                               "'<|end_header_id|>\n\n'+ message['content'] | trim + "
                               "'<|eot_id|>'") &&
                      contains(jinja, "bos_token + content") && !contains(jinja, "tool");
  check(chatml || llama3,
        "{}: its chat template is not one headlight recognises (ChatML or Llama-3); other "
        "templates would need a Jinja engine",
        what);
  if (chatml) {
    t.format_ = Format::chatml;
    // A default system message: "{% if loop.first and messages[0]['role'] != 'system' %}{{
    // '<|im_start|>system\n…<|im_end|>\n' }}{% endif %}".
    const std::string guard = "messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n";
    const size_t at = jinja.find(guard);
    if (at != std::string::npos) {
      const size_t begin = at + guard.size();
      const size_t end = jinja.find("<|im_end|>\n' }}", begin);
      check(end != std::string::npos && jinja.find('\'', begin) >= end,
            "{}: its ChatML template's default system message is not a plain string", what);
      t.default_system_ = jinja.substr(begin, end - begin);
    }
  } else {
    t.format_ = Format::llama3;
  }
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& bos_token) const {
  std::string out;
  if (format_ == Format::chatml) {
    if (!default_system_.empty() && !messages.empty() && messages[0].role != "system")
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    for (const ChatMessage& m : messages)
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
  } else {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i == 0) out += bos_token;
      out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
             trim(messages[i].content) + "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

std::vector<int32_t> chat_prompt(const Model& m, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  const ChatTemplate t = ChatTemplate::recognise(m.chat_template, m.path);
  check(m.tokenizer.has_value(), "{}: the model has no tokenizer{}{}", m.path,
        m.tokenizer_error.empty() ? "" : ": ", m.tokenizer_error);
  check(!messages.empty(), "messages: a chat needs at least one message");
  const model::TextTokenizer& tok = *m.tokenizer;
  const std::string bos = m.bos_id >= 0 && m.bos_id < tok.vocab_size()
                              ? tok.decode(std::vector<int32_t>{m.bos_id}, false)
                              : "";
  return tok.encode(t.render(messages, add_generation_prompt, bos),
                    /*add_special_tokens=*/false);
}

}  // namespace headlight::load
