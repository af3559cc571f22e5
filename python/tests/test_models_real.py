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


def test_bf16_products_are_closer_to_float32_than_transformers_in_bfloat16(smollm2, smollm2_ref, minilm):
    """dtype 'bfloat16' rounds the weights and each product's input to bf16 and keeps fp32
    activations: SmolLM2's logits stay nearer transformers' float32 logits than transformers'
    own bfloat16 model's do, and MiniLM's sentence embeddings keep a cosine above 0.999."""
    import copy
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "data" / "genesis.txt").read_text()[:3000]
    ids = np.array([smollm2.tokenizer.encode(text)[:200]], dtype=np.int32)
    with torch.no_grad():
        want = smollm2_ref(torch.tensor(ids, dtype=torch.long)).logits.numpy()
        theirs = copy.deepcopy(smollm2_ref).to(torch.bfloat16)(
            torch.tensor(ids, dtype=torch.long)).logits.float().numpy()
    assert smollm2.dtype == "float32"
    try:
        smollm2.dtype = "bfloat16"
        assert smollm2.dtype == "bfloat16"
        ours = smollm2.forward(ids)
        minilm.dtype = "bf16"
        e16 = minilm.encode(TEXTS[:4])
    finally:
        smollm2.dtype = "float32"
        minilm.dtype = "float32"
    e32 = minilm.encode(TEXTS[:4])
    error = lambda x: np.abs(x - want).max() / np.abs(want).max()
    assert error(ours) <= error(theirs), (error(ours), error(theirs))
    assert (ours.argmax(-1) == want.argmax(-1)).mean() >= (theirs.argmax(-1) == want.argmax(-1)).mean()
    assert ((e16 * e32).sum(1)).min() > 0.999
    with pytest.raises(ValueError, match="dtype: unknown dtype 'float16'"):
        smollm2.dtype = "float16"


CAPTURE_TEXTS = ["Maria lost her keys, so she looked under the sofa.",
                 "In the beginning God created the heaven and the earth. And the earth was "
                 "without form, and void; and darkness was upon the face of the deep.",
                 "def f(x):\n    return x ** 2  # déjà vu, 東京 🎉"]


@pytest.mark.parametrize("model_name", ["minilm", "smollm2"])
def test_capture_equals_transformers_output_attentions(model_name, request):
    """Every layer's and head's attention, the per-row statistics of the fused kernel and chosen
    heads recomputed after the forward equal transformers' eager output_attentions on several
    texts."""
    model = request.getfixturevalue(model_name)
    ref = request.getfixturevalue(model_name + "_ref")
    c = model.config
    for text in CAPTURE_TEXTS:
        ids = np.array([model.tokenizer.encode(text)], dtype=np.int32)
        with torch.no_grad():
            want = np.stack([a[0].numpy() for a in ref(torch.tensor(ids, dtype=torch.long),
                                                        output_attentions=True).attentions])
        assert np.abs(model.attention(ids) - want).max() < 1e-4, text
        chosen = [(0, 0), (c["n_layer"] - 1, c["n_head"] - 1), (c["n_layer"] // 2, 1)]
        cap = model.capture(ids, heads=chosen)
        for (layer, head) in chosen:
            assert np.abs(cap["heads"][(layer, head)] - want[layer, head]).max() < 1e-4
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.where(want > 0, want * np.log(want), 0).sum(-1)
        assert np.abs(cap["entropy"] - entropy).max() < 1e-3
        assert np.abs(cap["max_weight"] - want.max(-1)).max() < 1e-4
        picked = np.take_along_axis(want, cap["argmax"][..., None], -1)[..., 0]
        assert np.abs(picked - want.max(-1)).max() < 1e-4  # the argmax, or a key tied with it
    with pytest.raises(ValueError, match=r"heads: \(99, 0\) is not a head"):
        model.capture(ids, heads=[(99, 0)])
    with pytest.raises(ValueError, match=r"heads: \(0, -1\) is not a head"):
        model.capture(ids, heads=[(0, -1)])
    with pytest.raises(ValueError, match=r"tokens: expected a non-empty"):
        model.capture(np.zeros((1, 0), np.int32))
    too_long = np.zeros((1, c["block_size"] + 1), np.int32)
    with pytest.raises(ValueError, match=r"is longer than block_size"):
        model.capture(too_long)
    with pytest.raises(ValueError, match=r"is longer than block_size"):
        model.attention(too_long)


def test_head_importance_equals_gates_and_autograd_in_torch(tmp_path):
    """Gradient importance (Michel et al.: E|ξ·∂L/∂ξ| per window, normalised per layer) equals
    the same computed with transformers: gates on each head's slice of the output projection's
    input, autograd, one window at a time."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    ref = LlamaForCausalLM(cfg).eval()
    ref.save_pretrained(tmp_path / "llama")
    model = headlight.load(str(tmp_path / "llama"), threads=2)
    stream = np.random.default_rng(0).integers(0, 97, size=5 * 24 + 1).astype(np.int32)
    got = model.head_importance(stream, 24)
    gates = torch.ones(3, 6, requires_grad=True)
    hooks = []
    for layer, block in enumerate(ref.model.layers):
        def hook(module, args, layer=layer):
            x = args[0]
            return (x * gates[layer].repeat_interleave(8).to(x.dtype),)
        hooks.append(block.self_attn.o_proj.register_forward_pre_hook(hook))
    want = torch.zeros(3, 6)
    for w in range(5):
        x = torch.tensor(stream[None, w * 24:(w + 1) * 24], dtype=torch.long)
        y = torch.tensor(stream[None, w * 24 + 1:(w + 1) * 24 + 1], dtype=torch.long)
        logits = ref(x).logits
        loss = torch.nn.functional.cross_entropy(logits[0], y[0])
        (g,) = torch.autograd.grad(loss, gates)
        want += (gates * g).abs().detach()
    for h in hooks:
        h.remove()
    want = (want / want.norm(dim=1, keepdim=True)).numpy()
    assert np.abs(got - want).max() < 1e-4, (got, want)


def test_smollm2_greedy_generation_equals_transformers(smollm2, smollm2_ref):
    prompt = smollm2.tokenizer.encode("The capital of France is")
    got = smollm2.generate(np.array(prompt, dtype=np.int32), 24, temperature=0)
    with torch.no_grad():
        want = smollm2_ref.generate(torch.tensor([prompt], dtype=torch.long), max_new_tokens=24,
                                    do_sample=False)[0, len(prompt):].tolist()
    assert got == want
    assert "Paris" in smollm2.tokenizer.decode(got)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Capital of Italy?"},
     {"role": "assistant", "content": "Rome"},
     {"role": "user", "content": "  And of Spain?  "}],
]


@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("prompt", [True, False])
def test_smollm2_chatml_template_equals_transformers(smollm2, smollm2_tokenizer, chat, prompt):
    want = smollm2_tokenizer.apply_chat_template(CHATS[chat], add_generation_prompt=prompt,
                                                 tokenize=True, return_dict=False)
    assert smollm2.apply_chat_template(CHATS[chat], add_generation_prompt=prompt) == list(want)


LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def test_a_llama3_template_in_a_hugging_face_folder(smollm2_tokenizer, tmp_path):
    """A Llama folder with tokenizer.json and a Llama-3 chat template (SmolLM2's tokenizer,
    a small random model): ids as transformers renders the template, and a clear error for a
    template headlight does not know."""
    import json
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    tc = json.loads((tmp_path / "tokenizer_config.json").read_text())
    tc["chat_template"] = LLAMA3_TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tc))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    m = headlight.load(str(tmp_path))
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(tmp_path))
    for chat in CHATS:
        want = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
        assert m.apply_chat_template(chat) == list(want)
    tc["chat_template"] = "{{ messages[0]['content'] }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ValueError, match="not one headlight recognises"):
        headlight.load(str(tmp_path)).apply_chat_template(CHATS[0])


def test_cli_info_embed_generate_and_eval(minilm, tmp_path):
    import json
    import subprocess
    from pathlib import Path
    cli = Path(__file__).resolve().parents[2] / "build" / "release" / "apps" / "cli" / "headlight"

    def run(*args, check=True):
        return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                              check=check)

    info = json.loads(run("info", MINILM_DIR, "--json").stdout)
    assert (info["architecture"], info["layers"], info["heads"]) == ("BertModel", 6, 12)
    assert info["pooling"] == "mean, L2-normalised"
    assert info["stored_as"] == "F32 (read as float32)"
    info = json.loads(run("info", SMOLLM2_GGUF, "--json").stdout)
    assert (info["architecture"], info["kv_heads"], info["chat_template"]) == ("llama", 3, "ChatML")
    assert info["parameters"] == 134515008
    # the quantised file's types by share of the parameters (embeddings Q8_0, norms F32)
    assert info["stored_as"] == "Q4_1 78.9%, Q8_0 21.0%, F32 <0.1% (read as float32)"

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[:3] * 30) + "\n")
    out = tmp_path / "e.npy"
    r = run("embed", MINILM_DIR, "--input", texts, "--out", out, "--threads", 2)
    assert "90/90 texts" in r.stderr  # the progress bar on 64 texts or more
    got = np.load(out)
    assert got.shape == (90, 384)
    assert np.abs(got - minilm.encode(TEXTS[:3] * 30)).max() < 1e-6
    run("embed", MINILM_DIR, "--input", texts, "--out", out, "--threads", 2, "--dtype", "bf16")
    got16 = np.load(out)  # bf16 products: the same directions to bf16's precision, not the same
    assert got16.shape == got.shape and np.abs(got16 - got).max() > 0
    assert (got16 * got).sum(axis=1).min() > 0.9999  # both L2-normalised
    r = run("embed", SMOLLM2_GGUF, "--input", texts, "--out", tmp_path / "x.npy", check=False)
    assert r.returncode != 0 and "has no pooling" in r.stderr
    assert not (tmp_path / "x.npy").exists()

    r = run("generate", SMOLLM2_GGUF, "--chat", "--greedy", "--prompt",
            "What is the capital of France?", "--tokens", 20, "--threads", 2)
    assert r.stdout.strip() == "The capital of France is Paris."
    r = run("generate", MINILM_DIR, "--chat", check=False)
    assert r.returncode != 0 and "an encoder has no LM head" in r.stderr
    detective = Path(__file__).resolve().parents[2] / "models" / "detective.safetensors"
    r = run("generate", detective, "--chat", check=False)
    assert r.returncode != 0 and "the model has no chat template" in r.stderr

    r = run("eval", SMOLLM2_GGUF, "--corpus", texts, "--seq", 32, "--batch", 1, "--max-batches",
            1, "--json")
    assert 1.0 < json.loads(r.stdout)["perplexity"] < 1000.0


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(smollm2_tokenizer, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=1000, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"tokenizer\.json: the tokenizer has 49152 tokens, more "
                                         r"than config\.json's vocab_size 1000"):
        headlight.load(str(tmp_path))


def test_a_truncated_gguf_model_is_refused_naming_the_file(tmp_path):
    data = SMOLLM2_GGUF.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.gguf: .*"):
        headlight.load(str(cut))


def test_token_bytes_give_back_the_text_or_readable_pieces(minilm, smollm2):
    """Byte-level BPE: the tokens' bytes concatenate to the text, every line of the tokenizer test
    text; WordPiece: readable pieces (no "##", spaces before words)."""
    from pathlib import Path
    lines = (Path(__file__).resolve().parents[2] / "data" / "tokenizer_test.txt").read_text(
        encoding="utf-8").splitlines()
    tok = smollm2.tokenizer
    assert tok.lossless
    for line in lines:
        assert b"".join(tok.token_bytes(i) for i in tok.encode(line)) == line.encode(), line
    wp = minilm.tokenizer
    assert not wp.lossless
    ids = wp.encode("Maria's keys glittered")
    assert [wp.token(i) for i in ids] == [b"[CLS]", b"maria", b"'", b"s", b"keys", b"glitter",
                                          b"##ed", b"[SEP]"]
    assert [wp.token_bytes(i) for i in ids] == [b"[CLS]", b" maria", b" '", b" s", b" keys",
                                                b" glitter", b"ed", b"[SEP]"]


def test_head_tools_on_real_models(smollm2_tokenizer, tmp_path):
    """`heads` on an embedding model (MiniLM: roles, importance on its sentence embeddings) and on
    a small Llama folder with a real tokenizer (importance and ablation on its LM loss); `prune
    --curve` on the Llama; `explain` on decoders."""
    import json
    import subprocess
    from pathlib import Path
    from transformers import LlamaConfig, LlamaForCausalLM
    cli = Path(__file__).resolve().parents[2] / "build" / "release" / "apps" / "cli" / "headlight"

    def run(*args, check=True):
        return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                              check=check)

    coref = Path(__file__).resolve().parents[2] / "data" / "coreference.json"
    doc = json.loads(run("heads", MINILM_DIR, "--sequences", 2, "--seq", 32, "--threads", 2,
                         "--coreference", coref, "--json").stdout)
    heads = doc["heads"]
    assert doc["coreference"]["passages"] == 68
    assert np.array(doc["coreference"]["accuracy"]).shape == (6, 12)
    r = run("heads", MINILM_DIR, "--sequences", 2, "--seq", 32, "--coreference", coref)
    assert "natural coreference over 68 passages" in r.stdout and "best heads: layer" in r.stdout
    r = run("heads", MINILM_DIR, "--coreference", tmp_path / "absent.json", check=False)
    assert r.returncode != 0 and "absent.json: cannot be read" in r.stderr
    assert len(heads) == 6 * 12
    # An embedding model's importance is measured on its sentence embeddings.
    assert all(np.isfinite(h["importance"]) and np.isfinite(h["ablation"]) for h in heads)
    assert max(h["scores"]["previous_token"] for h in heads if h["layer"] == 0) > 0.9

    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    smollm2_tokenizer.save_pretrained(tmp_path / "llama")
    heads = json.loads(run("heads", tmp_path / "llama", "--sequences", 2, "--seq", 64, "--json")
                       .stdout)["heads"]
    assert len(heads) == 2 * 4
    assert all(np.isfinite(h["importance"]) and np.isfinite(h["ablation"]) for h in heads)
    curve = json.loads(run("prune", tmp_path / "llama", "--curve", "--sequences", 2, "--seq", 64,
                           "--json").stdout)["curve"]
    assert {p["method"] for p in curve} >= {"importance", "random"}
    r = run("heads", tmp_path / "llama", "--seq", 5000, check=False)
    assert r.returncode != 0 and "--seq: 5000 is longer than the model's context 4096" in r.stderr
    # A text longer than the context, or empty, is refused before any work.
    long_text = "word " * 5000
    for args, message in [(["heads", tmp_path / "llama", "--text", long_text],
                           "tokens, longer than the model's context 4096"),
                          (["explain", tmp_path / "llama", long_text],
                           "tokens, longer than the model's context 4096"),
                          (["explain", tmp_path / "llama", ""], "text: empty")]:
        r = run(*args, "--report", tmp_path / "x.html", check=False) if args[0] == "explain" \
            else run(*args, check=False)
        assert r.returncode != 0 and message in r.stderr, (args[0], r.stderr[-300:])
    assert not (tmp_path / "x.html").exists()

    # explain: any decoder gets the whole report (grouped-query ones too); an encoder a clear
    # error before any work, and no report.
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(vocab_size=49152, n_embd=32, n_layer=2, n_head=4,
                               n_positions=128)).save_pretrained(tmp_path / "gpt2")
    smollm2_tokenizer.save_pretrained(tmp_path / "gpt2")
    report = tmp_path / "report.html"
    r = run("explain", tmp_path / "gpt2", "Maria lost her keys; later she found them.",
            "--sequences", 2, "--seq", 64, "--no-curve", "--report", report)
    assert "Continuation:" in r.stdout and "Previous-token head" in r.stdout
    assert "<html" in report.read_text()[:200].lower()
    report.unlink()
    r = run("explain", tmp_path / "llama", "Maria lost her keys; later she found them.",
            "--sequences", 2, "--seq", 64, "--no-curve", "--report", report)
    assert "Pruning 30% of the heads (2)" in r.stdout and report.exists()
    # An embedding model: no continuation, pruning judged by the held-out sentence embeddings.
    report.unlink()
    prose = Path(__file__).resolve().parents[2] / "data" / "genesis.txt"
    r = run("explain", MINILM_DIR, "Maria lost her keys; later she found them.", "--corpus", prose,
            "--sequences", 2, "--no-curve", "--no-ablation", "--report", report)
    assert "Continuation" not in r.stdout and "held-out 1 − cosine 0.0000 →" in r.stdout
    assert report.exists()
    # An encoder with neither an LM head nor pooling: a clear error before any work, no report.
    from transformers import BertConfig, BertModel
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64)).save_pretrained(
        tmp_path / "bert")
    (tmp_path / "bert" / "tokenizer.json").write_bytes((MINILM_DIR / "tokenizer.json").read_bytes())
    report.unlink()
    r = run("explain", tmp_path / "bert", "text", "--report", report, check=False)
    assert r.returncode != 0 and "has neither an LM head nor pooling" in r.stderr
    assert not report.exists()


def reference_coreference(model, passages):
    """The scoring of inspect/coreference.h written again from its description: tokens aligned to
    the text's non-space characters (case aside), spans summed, the pronoun's first token's row."""
    tok = model.tokenizer
    c = model.config
    right = np.zeros((c["n_layer"], c["n_head"]))
    nearest = scored = 0
    for p in passages:
        text = p["text"]
        ids = tok.encode(text)
        owner = [-1] * len(text)
        pos = 0
        for t, i in enumerate(ids):
            content = "".join(ch.lower() for ch in tok.token_bytes(i).decode() if not ch.isspace())
            q, taken = pos, []
            for ch in content:
                while q < len(text) and text[q].isspace():
                    q += 1
                if q >= len(text) or text[q].lower() != ch:
                    taken = None
                    break
                taken.append(q)
                q += 1
            if content and taken is not None:
                for k in taken:
                    owner[k] = t
                pos = q
        def span(at, length):
            ts = [owner[k] for k in range(at, at + length) if owner[k] >= 0]
            return ts[0], ts[-1]
        pron = owner[p["pronoun_at"]]
        ante = span(p["antecedent"]["at"], len(p["antecedent"]["name"]))
        others = [span(d["at"], len(d["name"])) for d in p["distractors"]]
        att = model.attention(np.array([ids], dtype=np.int32))
        w = lambda s: att[:, :, pron, s[0]:s[1] + 1].sum(-1)
        best = np.ones(right.shape, dtype=bool)
        for o in others:
            best &= w(ante) > w(o)
        right += best
        nearest += all(ante[1] > o[1] for o in others)
        scored += 1
    return scored, right / scored, nearest / scored


def test_natural_coreference_equals_its_description(minilm, smollm2, tmp_path):
    """Model.coreference against the scoring rewritten in numpy on the first 20 passages, for
    WordPiece (MiniLM) and byte-level BPE (SmolLM2); the whole set scores every passage."""
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "data" / "coreference.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    subset = tmp_path / "coreference.json"
    subset.write_text(json.dumps({"passages": doc["passages"][:20]}))
    for model in (minilm, smollm2):
        got = model.coreference(str(subset))
        scored, accuracy, nearest = reference_coreference(model, doc["passages"][:20])
        assert got["passages"] == scored == 20
        assert np.array_equal(got["accuracy"], accuracy)
        assert got["nearest_name_accuracy"] == pytest.approx(nearest)
    full = minilm.coreference(str(path))
    assert full["passages"] == len(doc["passages"]) >= 60
    assert 0.5 < full["nearest_name_accuracy"] < 0.7
    with pytest.raises(ValueError, match=r"passage 0: distractor \"Nobody\" is not at its offset"):
        bad = dict(doc["passages"][0])
        bad["distractors"] = [{"name": "Nobody", "at": 0}]
        subset.write_text(json.dumps({"passages": [bad]}))
        minilm.coreference(str(subset))


def test_smollm2_in_transformers_with_headlight_attention(smollm2_ref):
    # The real pretrained Llama-family model, loaded by transformers, with every attention layer on
    # headlight (headlight.torch.register): the logits and the captured attention equal "eager"'s.
    import headlight.torch as ht

    ids = torch.tensor([list(range(400, 440))], dtype=torch.long)
    with torch.no_grad():
        ref = smollm2_ref(ids, output_attentions=True)
        smollm2_ref.set_attn_implementation(ht.register())
        try:
            with ht.capture(smollm2_ref) as heads:
                got = smollm2_ref(ids).logits
        finally:
            smollm2_ref.set_attn_implementation("eager")
    want = ref.logits
    assert (got - want).abs().max().item() < 2e-5 * want.abs().max().item()
    captured = heads.attentions()
    assert len(captured) == 30
    for layer, a in enumerate(ref.attentions):
        assert (captured[layer] - a).abs().max().item() < 1e-4, layer
