"""The GGUF reader against the gguf package (the reference reader and its numpy dequantisers): every
supported tensor type dequantised bit for bit, metadata of every value type, the real SmolLM2 file,
and bad files refused with an error that names the file and the field."""

from pathlib import Path

import numpy as np
import pytest

import headlight

import gguf  # pinned in python/requirements-dev.txt
from gguf import GGMLQuantizationType as Q

from model_files import SMOLLM2_GGUF as SMOLLM2

# (type, values per block, bytes per block, offsets of the float16 scales in a block)
BLOCKS = {
    Q.Q8_0: (32, 34, [0]),
    Q.Q4_0: (32, 18, [0]),
    Q.Q4_1: (32, 20, [0, 2]),
    Q.Q4_K: (256, 144, [0, 2]),
    Q.Q5_K: (256, 176, [0, 2]),
    Q.Q6_K: (256, 210, [208]),
}


def random_blocks(rng, qtype, rows, cols):
    """Random quantised data whose float16 scales are finite (so that NaN never compares)."""
    per, nbytes, scales = BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // per, nbytes), dtype=np.uint8)
    for off in scales:
        blocks[:, off:off + 2] = rng.uniform(-2, 2, size=(len(blocks), 1)).astype(np.float16).view(
            np.uint8)
    return blocks.reshape(rows, cols // per * nbytes)


def oracle(path):
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                 dtype=np.float32).reshape(shape)
    return reader, out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "every_type.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float32("t.f32", 0.125)
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "Grüße, 世界")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.strs", ["a", "bc", ""])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f32_3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((4, 7)).astype(np.float16))
    bf16 = rng.integers(0, 2**16, size=(2, 9), dtype=np.uint16)
    bf16[(bf16 & 0x7F80) == 0x7F80] = 0  # no NaN or infinity
    w.add_tensor("bf16", bf16.view(np.uint8), raw_dtype=Q.BF16)  # shape from the bytes
    for qtype, (per, _, _) in BLOCKS.items():
        rows, cols = 3, 2 * per
        w.add_tensor(qtype.name.lower(), random_blocks(rng, qtype, rows, cols), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_tensor_type_equals_the_gguf_package_bit_for_bit(synthetic):
    metadata, tensors = headlight.read_gguf(str(synthetic))
    _, want = oracle(str(synthetic))
    assert set(tensors) == set(want)
    for name, ref in want.items():
        assert tensors[name].shape == ref.shape, name
        np.testing.assert_array_equal(tensors[name], ref, err_msg=name)
    assert tensors["q4_k"].shape == (3, 512) and tensors["f32_3d"].shape == (2, 3, 4)


def test_metadata_of_every_value_type(synthetic):
    md, _ = headlight.read_gguf(str(synthetic))
    assert md["general.architecture"] == "llama"
    assert (md["t.u8"], md["t.i8"], md["t.u16"], md["t.i16"]) == (250, -7, 65000, -30000)
    assert (md["t.u32"], md["t.i32"], md["t.u64"], md["t.i64"]) == (4_000_000_000, -2_000_000_000,
                                                                    2**63 + 5, -(2**40))
    assert md["t.f32"] == 0.125 and md["t.f64"] == 1e-300 and md["t.bool"] is True
    assert md["t.str"] == "Grüße, 世界"
    assert md["t.ints"] == [1, 2, 3] and md["t.strs"] == ["a", "bc", ""]
    assert md["t.nested"] == [[1, 2], [3]]


def test_smollm2_every_tensor_and_the_tokenizer_metadata():
    md, tensors = headlight.read_gguf(str(SMOLLM2))
    reader, want = oracle(str(SMOLLM2))
    assert len(tensors) == len(want) == 272
    types = {t.tensor_type for t in reader.tensors}
    assert {Q.Q4_1, Q.Q8_0, Q.F32} <= types
    for name, ref in want.items():
        np.testing.assert_array_equal(tensors[name], ref, err_msg=name)
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == 30
    assert md["llama.attention.head_count"] == 9 and md["llama.attention.head_count_kv"] == 3
    assert md["llama.rope.freq_base"] == 100000.0
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    assert md["tokenizer.ggml.tokens"] == tokens and len(tokens) == 49152
    assert "<|im_start|>" in md["tokenizer.chat_template"]


def read_error(path):
    with pytest.raises(ValueError) as e:
        headlight.read_gguf(str(path))
    return str(e.value)


def test_truncated_files_are_refused_naming_the_file(synthetic, tmp_path):
    data = synthetic.read_bytes()
    last = max(gguf.GGUFReader(str(synthetic)).tensors, key=lambda t: t.data_offset)
    end = last.data_offset + last.n_bytes  # what follows is padding
    cut = tmp_path / "cut.gguf"
    for n in [0, 3, 4, 10, 23, 24, 40, 200, 600, len(data) // 2, end - 1]:
        cut.write_bytes(data[:n])
        msg = read_error(cut)
        assert str(cut) in msg, msg


def test_crafted_counts_and_types_are_refused(synthetic, tmp_path):
    data = bytearray(synthetic.read_bytes())
    bad = tmp_path / "bad.gguf"

    def with_bytes(offset, raw):
        b = bytearray(data)
        b[offset:offset + len(raw)] = raw
        bad.write_bytes(bytes(b))
        return read_error(bad)

    assert "not a GGUF file" in with_bytes(0, b"GGML")
    assert "version 1" in with_bytes(4, (1).to_bytes(4, "little"))
    assert "tensors cannot fit" in with_bytes(8, (2**62).to_bytes(8, "little"))
    assert "metadata entries cannot fit" in with_bytes(16, (2**61).to_bytes(8, "little"))
    # The first key's length: far past the end of the file.
    assert "past the end of the file" in with_bytes(24, (2**60).to_bytes(8, "little"))


def test_an_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "q5_0.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", np.zeros((2, 22), dtype=np.uint8), raw_dtype=Q.Q5_0)  # one block a row
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    msg = read_error(path)
    assert 'tensor "w"' in msg and "Q5_0" in msg and "not supported" in msg
