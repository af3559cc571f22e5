"""headlight: multi-head attention that is fast and inspectable.

The functions and classes here are thin bindings over the C++ library:

- ``scaled_dot_product_attention`` and ``scaled_dot_product_attention_backward`` with the semantics of
  ``torch.nn.functional.scaled_dot_product_attention`` (a query row with no allowed key gives zeros);
- ``MultiheadAttention`` with the semantics, parameter names and shapes of
  ``torch.nn.MultiheadAttention``, plus grouped-query attention (``num_kv_heads``), per-head gates
  and an explicit ``backward``;
- ``load(path)``: a pretrained model (Hugging Face folder, GGUF file or headlight checkpoint) as a
  ``Model`` with its tokenizer: ``forward``, ``backward``, ``attention``, ``generate``, ``encode``
  (sentence embeddings), ``apply_chat_template`` (docs/models.md).

Arrays are numpy float32 (other real dtypes are converted); errors are ``ValueError``.
"""

from ._headlight import (  # noqa: F401
    GPT,
    AdamW,
    HeadlightError,
    Tokenizer,
    lr_at,
    MultiheadAttention,
    cpu_info,
    read_gguf,
    load,
    Model,
    TextTokenizer,
    read_safetensors,
    WordPieceTokenizer,
    ByteLevelBPETokenizer,
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    head_roles,
    head_report,
)

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "AdamW",
    "HeadlightError",
    "Tokenizer",
    "lr_at",
    "MultiheadAttention",
    "cpu_info",
    "read_gguf",
    "load",
    "Model",
    "TextTokenizer",
    "read_safetensors",
    "WordPieceTokenizer",
    "ByteLevelBPETokenizer",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "head_roles",
    "head_report",
]
