"""The two real models of python/requirements-models.txt through headlight.load, against their
reference implementations: all-MiniLM-L6-v2 (a Hugging Face folder) against transformers and
sentence-transformers, SmolLM2-135M-Instruct (a GGUF file in Q4_1/Q8_0) against transformers reading
the same file. Each model is loaded once per module."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

import headlight
from model_files import MINILM_DIR, SMOLLM2_GGUF

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Maria lost her keys; she found them under the sofa.",
    "hello",
    "Café crème brûlée à la carte — déjà vu!",
    "東京は日本の首都です。",
    "def f(x):\n    return x ** 2  # square",
    "Prices rose 3.5% in 2024, to $1,234.56 per unit.",
    "emoji 🎉🚀 and    runs   of   spaces",
    " ".join(["word"] * 400),  # longer than max_seq_length: cut as sentence-transformers cuts
    "A sentence of medium length that talks about heads, attention and what they do.",
]


@pytest.fixture(scope="module")
def minilm():
    return headlight.load(str(MINILM_DIR), threads=2)


@pytest.fixture(scope="module")
def minilm_ref():
    from transformers import AutoModel
    return AutoModel.from_pretrained(str(MINILM_DIR), attn_implementation="eager").eval()


def test_minilm_config_and_tokenizer(minilm):
    c = minilm.config
    assert (c["architecture"], c["n_layer"], c["n_head"], c["n_embd"]) == ("BertModel", 6, 12, 384)
    assert (c["pooling"], c["normalize"], c["max_seq_length"]) == ("mean", True, 256)
    ref = Tokenizer.from_file(str(MINILM_DIR / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    for text in TEXTS:
        assert minilm.tokenizer.encode(text) == ref.encode(text).ids
    ids = minilm.tokenizer.encode(TEXTS[1])
    assert minilm.tokenizer.decode(ids) == ref.decode(ids)


def test_minilm_hidden_states_and_attention_equal_transformers(minilm, minilm_ref):
    ids = np.array([minilm.tokenizer.encode(TEXTS[1])], dtype=np.int32)
    with torch.no_grad():
        ref = minilm_ref(torch.tensor(ids, dtype=torch.long), output_attentions=True)
    got = minilm.forward(ids)
    want = ref.last_hidden_state.numpy()
    assert np.abs(got - want).max() < 2e-5 * np.abs(want).max()
    att = minilm.attention(ids)
    for layer, a in enumerate(ref.attentions):
        assert np.abs(att[layer] - a[0].numpy()).max() < 1e-5


def test_minilm_embeddings_equal_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(MINILM_DIR), device="cpu")
    want = st.encode(TEXTS, batch_size=4)
    got = minilm.encode(TEXTS, batch_size=4)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 384)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999, cos
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_encode_is_independent_of_the_batch_size(minilm):
    a = minilm.encode(TEXTS, batch_size=1)
    b = minilm.encode(TEXTS, batch_size=32)
    assert np.abs(a - b).max() < 1e-6


@pytest.fixture(scope="module")
def smollm2():
    return headlight.load(str(SMOLLM2_GGUF), threads=2)


@pytest.fixture(scope="module")
def smollm2_ref():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(
        str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32,
        attn_implementation="eager").eval()


def test_smollm2_config(smollm2):
    c = smollm2.config
    assert (c["architecture"], c["n_layer"], c["n_head"], c["n_kv_head"], c["n_embd"]) == (
        "llama", 30, 9, 3, 576)
    assert (c["rope_base"], c["activation"], c["norm"]) == (100000.0, "swiglu", "rmsnorm")
    assert c["eos_token_ids"] == [2]
    assert "<|im_start|>" in smollm2.chat_template


def test_smollm2_logits_and_attention_equal_transformers(smollm2, smollm2_ref):
    ids = np.array([smollm2.tokenizer.encode("Maria lost her keys, so she looked under the sofa.")],
                   dtype=np.int32)
    with torch.no_grad():
        ref = smollm2_ref(torch.tensor(ids, dtype=torch.long), output_attentions=True)
    got = smollm2.forward(ids)
    want = ref.logits.numpy()
    assert np.abs(got - want).max() < 2e-5 * np.abs(want).max()
    att = smollm2.attention(ids)
    assert att.shape == (30, 9, ids.shape[1], ids.shape[1])
    for layer, a in enumerate(ref.attentions):
        assert np.abs(att[layer] - a[0].numpy()).max() < 1e-4, layer


def test_smollm2_greedy_generation_equals_transformers(smollm2, smollm2_ref):
    prompt = smollm2.tokenizer.encode("The capital of France is")
    got = smollm2.generate(np.array(prompt, dtype=np.int32), 24, temperature=0)
    with torch.no_grad():
        want = smollm2_ref.generate(torch.tensor([prompt], dtype=torch.long), max_new_tokens=24,
                                    do_sample=False)[0, len(prompt):].tolist()
    assert got == want
    assert "Paris" in smollm2.tokenizer.decode(got)
