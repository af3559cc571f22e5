"""The head report and the demo's summary, end to end through the CLI: the HTML report renders in
headless Chromium (Debian's `chromium`) with no script errors, its head view draws lines and a
screenshot is not blank; the summary's numbers are those of `headlight heads --json`."""

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

import headlight

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"
STORY = ("The red key for Maria lay in the kitchen. The blue map for John lay in the garden. "
         "Later she opened the door with her")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """A small byte-level model, trained briefly so that its heads are not all alike."""
    path = tmp_path_factory.mktemp("model") / "m.safetensors"
    subprocess.run([str(CLI), "train", "--steps", "60", "--n-layer", "2", "--n-head", "2",
                    "--n-embd", "32", "--block-size", "128", "--batch", "8", "--stories", "400",
                    "--val-stories", "40", "--eval-every", "60", "--out", str(path),
                    "--threads", "2"], check=True, capture_output=True)
    return path


def run_explain(model_path, report, *extra):
    out = subprocess.run([str(CLI), "explain", str(model_path), STORY, "--report", str(report),
                          "--sequences", "4", "--threads", "2", *extra],
                         check=True, capture_output=True, text=True, errors="replace")
    return out.stdout


def decode_png(data):
    """Pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes), as an array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)], dtype=np.uint8).astype(np.int32)
        cur = np.zeros(stride, dtype=np.int32)
        for x in range(stride):
            a = cur[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 0:
                p = 0
            elif f == 1:
                p = a
            elif f == 2:
                p = b
            elif f == 3:
                p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x] = (line[x] + p) & 255
        out[y], prev = cur, cur
    return out.reshape(height, width, channels)


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Chromium is not installed (Debian: chromium); the report's browser test is skipped")
    probe = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                            "data:text/html,<p>ok</p>"], capture_output=True, text=True, timeout=120)
    if "<p>ok</p>" not in probe.stdout:
        pytest.skip(f"Chromium cannot start here: {probe.stderr.strip()[-300:]}")
    return exe


def test_report_renders_in_headless_chromium(model_path, tmp_path):
    exe = chromium()
    report = tmp_path / "report.html"
    run_explain(model_path, report, "--png", str(tmp_path / "head.png"), "--npy",
                str(tmp_path / "p.npy"), "--capture-json", str(tmp_path / "c.json"))
    probs = np.load(tmp_path / "p.npy")
    capture = json.loads((tmp_path / "c.json").read_text())
    assert probs.shape == (2, 2, capture["seq"], capture["seq"])
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)  # exact attention: rows sum to 1
    assert len(capture["words"]) < capture["seq"] and capture["stats"][0]["entropy"] >= 0
    words = np.array(capture["word_probs"])
    assert words.shape == (2, 2, len(capture["words"]), len(capture["words"]))
    np.testing.assert_allclose(words.sum(-1), 1.0, atol=1e-3)
    html = report.read_text()
    assert "<script src" not in html and "http://" not in html.replace("http://www.w3.org", "")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([exe, *flags, "--dump-dom", report.as_uri()], capture_output=True,
                         text=True, timeout=120)
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    assert 'data-rendered="ok"' in body, body
    assert 'data-errors="0"' in body, body
    assert int(re.search(r'data-lines="(\d+)"', body).group(1)) > 10  # the head view drew lines
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,900",
                    f"--screenshot={shot}", report.as_uri()], capture_output=True, timeout=120)
    pixels = decode_png(shot.read_bytes())[..., :3]
    assert pixels.shape[0] == 900
    dark = (pixels.sum(axis=2) < 600).mean()  # not a blank page: text, lines and heatmaps
    assert dark > 0.01, dark
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20
    # The PNG heatmap from libpng decodes and has a cell per attention entry.
    heat = decode_png((tmp_path / "head.png").read_bytes())
    assert heat.shape[0] == heat.shape[1] and heat.shape[0] % 8 == 0


def test_summary_numbers_come_from_the_model(model_path, tmp_path):
    doc = json.loads(subprocess.run([str(CLI), "heads", str(model_path), "--json", "--sequences",
                                     "4", "--threads", "2"], check=True, capture_output=True,
                                    text=True).stdout)
    heads, uniform = doc["heads"], doc["uniform"]
    assert len(heads) == 4 and {"previous_token", "induction", "coreference"} <= set(heads[0]["scores"])
    summary = run_explain(model_path, tmp_path / "r.html", "--no-curve")
    for role, label in [("previous_token", "Previous-token head"), ("induction", "Induction head")]:
        best = max(heads, key=lambda h: h["scores"][role])
        m = re.search(label + r": layer (\d+) head (\d+) \(score ([0-9.]+)[ );]", summary)
        assert m, summary
        assert (int(m.group(1)), int(m.group(2))) == (best["layer"], best["head"])
        assert abs(float(m.group(3)) - best["scores"][role]) < 0.006
        # Beside it, what a head attending uniformly scores on the same sequences.
        m = re.search(label + r": [^\n]*uniform[a-z ]*: ([0-9.]+)\)", summary)
        assert m and abs(float(m.group(1)) - uniform[role]) < 0.006, summary
    best = max(heads, key=lambda h: h["scores"]["previous_token"])
    m = re.search(r"Previous-token head: .*, ([0-9.]+) on the test stories;", summary)
    assert m and abs(float(m.group(1)) - best["scores"]["previous_token_text"]) < 0.006, summary
    assert "coreference_sentence_accuracy" in heads[0]["scores"]
    m = re.search(r"Pronoun-resolving head: layer (\d+) head (\d+): .* for (\d+)% .*\(score ([0-9.]+)\)",
                  summary)
    if m:  # only when the test stories fit the model's context
        best = max(heads, key=lambda h: h["scores"]["coreference_sentence"])
        assert abs(float(m.group(4)) - best["scores"]["coreference_sentence"]) < 0.006, summary
    # Another model gives other numbers: nothing in the summary is fixed text.
    other = tmp_path / "other.safetensors"
    m2 = headlight.GPT(headlight.GPT.load(str(model_path)).config, seed=99)
    m2.tokenizer = headlight.Tokenizer.byte_level()
    m2.save(str(other))
    assert run_explain(other, tmp_path / "r2.html", "--no-curve").split("•")[2:] != summary.split("•")[2:]


def test_prune_json_and_the_pruned_checkpoint(model_path, tmp_path):
    out = tmp_path / "small.safetensors"
    r = json.loads(subprocess.run([str(CLI), "prune", str(model_path), "--fraction", "0.5", "--by",
                                   "random", "--seed", "3", "--out", str(out), "--json",
                                   "--sequences", "4", "--threads", "2"], check=True,
                                  capture_output=True, text=True).stdout)
    assert set(r) == {"measure", "loss_before", "loss_after", "seconds_before", "seconds_after",
                      "heads_removed"}
    assert r["measure"] == "loss"
    assert len(r["heads_removed"]) == 2
    small = headlight.GPT.load(str(out))
    assert sum(small.config["layer_heads"]) == 2
    # The pruned checkpoint loads, runs and generates.
    assert len(small.generate(np.array(small.tokenizer.encode("Maria")), 5, temperature=0)) == 5
    # It computes what the full model computes with those heads' gates at 0.
    full = headlight.GPT.load(str(model_path))
    gates = full.gates
    for layer, head in r["heads_removed"]:
        gates[layer, head] = 0
    full.gates = gates
    tokens = np.array([full.tokenizer.encode(STORY)[:100]])
    np.testing.assert_allclose(small.forward(tokens), full.forward(tokens), atol=1e-5)


def test_the_demo_asks_a_real_model_too(model_path, tmp_path):
    """`demo --real-model`: after the first model, the same question on a grouped-query Llama
    folder with a real tokenizer — which heads link "she" to "Maria", natural coreference, the
    roles beside a uniform head's scores, pruning judged on held-out prose — and a second report
    beside the first, which renders (ablation not measured: "n/a") with no script errors."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from model_files import SMOLLM2_GGUF
    folder = tmp_path / "tiny-llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=256)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent),
                                  gguf_file=SMOLLM2_GGUF.name).save_pretrained(folder)
    report = tmp_path / "demo" / "report.html"
    out = subprocess.run([str(CLI), "demo", "--model", str(model_path), "--real-model", str(folder),
                          "--report", str(report), "--sequences", "4", "--threads", "2"],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    real = out.split("— The same question on a real model: tiny-llama (LlamaForCausalLM, 2 layers "
                     "× 4 heads, 2 key/value heads each) —")[1]
    assert re.search(r'Heads linking "she" to "Maria": \d of 8 attend more to "Maria" than to '
                     r'"John"', real), real
    assert re.search(r"Natural coreference \(\d+ passages of data/coreference.json\): the best "
                     r"heads are layer \d head \d \(\d+%\)", real), real
    assert re.search(r"Induction head: layer \d head \d \(score [0-9.]+; uniform: [0-9.]+\)", real)
    assert "Pruning 30% of the heads (2): held-out loss" in real
    assert "Continuation: …" in real and "Continuation: …blue" in out  # cut at a word
    second = report.parent / "report-tiny-llama.html"
    assert report.exists() and second.exists()
    html = second.read_text()
    assert '"kv_head":1' in html and '"ablation":null' in html
    # The report opens on the head that links "she" to "Maria" most strongly.
    strongest = re.search(r"the strongest: layer (\d+) head (\d+)", real)
    if strongest:
        assert f'"focus":[{strongest.group(1)},{strongest.group(2)}]' in html
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                              second.as_uri()], capture_output=True, text=True, timeout=120)
        body = re.search(r"<body([^>]*)>", dom.stdout)
        if body:  # Chromium could start
            assert 'data-errors="0"' in body.group(1), body.group(1)
            assert "n/a" in dom.stdout
