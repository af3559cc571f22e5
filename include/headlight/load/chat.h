// Chat templates. Models carry theirs as Jinja text (tokenizer_config.json's "chat_template", a
// GGUF's tokenizer.chat_template); no well-kept C++ Jinja library is packaged for Debian 12, so
// headlight recognises the common templates by their text and renders them itself:
//   ChatML (SmolLM2, Qwen, …): "<|im_start|>{role}\n{content}<|im_end|>\n" per message, and
//     "<|im_start|>assistant\n" as the generation prompt; a default system message when the
//     template inserts one before a conversation that has none.
//   Llama-3: bos_token, then "<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}
//     <|eot_id|>" per message, and "<|start_header_id|>assistant<|end_header_id|>\n\n".
// Any other template (Llama-3.1's tool-calling one, Gemma's, …) is refused with an error that
// says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace headlight::load {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  enum class Format { chatml, llama3 };
  // Recognises `jinja`; `what` names the model in errors (an empty template: the model has none).
  static ChatTemplate recognise(const std::string& jinja, const std::string& what);

  Format format() const { return format_; }
  const char* name() const { return format_ == Format::chatml ? "ChatML" : "Llama-3"; }
  // The text the template renders for `messages`, ending with the assistant's prompt when
  // add_generation_prompt. `bos_token` is the text of the BOS token (Llama-3 starts with it).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token = "") const;

 private:
  Format format_ = Format::chatml;
  std::string default_system_;  // ChatML: inserted when the first message is not "system"
};

struct Model;  // load/model.h

// The token ids of `messages` in the model's chat template (recognised as above), as
// transformers' apply_chat_template(…, tokenize=True) gives them: the rendered text encoded
// without the tokenizer's own special tokens (the template puts them). Errors name the model.
std::vector<int32_t> chat_prompt(const Model& m, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

}  // namespace headlight::load
