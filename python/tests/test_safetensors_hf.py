"""Hugging Face safetensors checkpoints: all-MiniLM-L6-v2's file (which holds an I64 buffer beside
its float weights) and a checkpoint transformers writes in shards, read equal to the safetensors
package's reading of the same files."""

import numpy as np
import pytest
import safetensors.numpy
import torch
from model_files import MINILM_DIR

import headlight


def test_minilm_weights_equal_the_safetensors_package():
    _, tensors = headlight.read_safetensors(str(MINILM_DIR / "model.safetensors"))
    want = safetensors.numpy.load_file(str(MINILM_DIR / "model.safetensors"))
    floats = {k: v for k, v in want.items() if v.dtype.kind == "f"}
    assert set(tensors) == set(floats) and "embeddings.position_ids" in want
    for name, ref in floats.items():
        np.testing.assert_array_equal(tensors[name], ref.astype(np.float32), err_msg=name)


def test_a_sharded_checkpoint_written_by_transformers(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100,
                                       n_positions=16))
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.exists() and len(list(tmp_path.glob("model-*.safetensors"))) > 1
    _, tensors = headlight.read_safetensors(str(index))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, state[name], err_msg=name)
    assert len(tensors) >= len(state) - 1  # the tied lm_head is not stored twice


def test_a_shard_outside_the_folder_is_refused(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"w": "../../etc/passwd"}}')
    with pytest.raises(ValueError, match="not a file name beside the index"):
        headlight.read_safetensors(str(index))
