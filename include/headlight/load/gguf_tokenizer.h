// The tokenizer a GGUF file describes in its metadata (tokenizer.ggml.*), built as Hugging Face
// transformers builds it from the same file (the oracle the tests compare with):
//   tokenizer.ggml.model "gpt2"   byte-level BPE from tokenizer.ggml.tokens and .merges
//   tokenizer.ggml.pre            the pre-tokeniser: Llama-3's pattern for the Llama-3 family
//                                 ("llama-bpe", "llama3", "smaug-bpe", …), GPT-2's for the others
//                                 that transformers also treats so ("smollm", "gpt2", …); names
//                                 whose own patterns headlight does not have yet are refused
//   tokenizer.ggml.token_type     3 (control) tokens are special, 4 (user-defined) tokens added
//   tokenizer.ggml.add_bos_token  when true, bos_token_id starts every sequence
// Other tokenizer models (SentencePiece "llama", …) are refused with an error naming them.
#pragma once

#include "headlight/io/gguf.h"
#include "headlight/model/byte_bpe.h"

namespace headlight::load {

model::ByteLevelBpeSpec tokenizer_spec_from_gguf(const io::GgufFile& file);
model::ByteLevelBpeTokenizer tokenizer_from_gguf(const io::GgufFile& file);

}  // namespace headlight::load
