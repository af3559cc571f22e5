"""Bad input gets a ValueError that names the argument and the shapes, never a crash."""

import numpy as np
import pytest

import headlight

r = np.random.default_rng(0)


def arr(*shape):
    return r.standard_normal(shape).astype(np.float32)


def test_num_heads_must_divide_embed_dim():
    with pytest.raises(ValueError, match=r"embed_dim \(10\).*num_heads \(3\)"):
        headlight.MultiheadAttention(10, 3)


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\).*num_heads \(4\)"):
        headlight.MultiheadAttention(8, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        headlight.MultiheadAttention(8, 4, num_kv_heads=0)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_dropout_out_of_range(p):
    with pytest.raises(ValueError, match="dropout"):
        headlight.MultiheadAttention(8, 2, dropout=p)
    with pytest.raises(ValueError, match="dropout_p"):
        headlight.scaled_dot_product_attention(arr(2, 3, 4), arr(2, 3, 4), arr(2, 3, 4), dropout_p=p)


def test_mismatched_batch_dims():
    with pytest.raises(ValueError, match=r"batch.*\[2, 2, 3, 4\].*\[3, 2, 3, 4\]"):
        headlight.scaled_dot_product_attention(arr(2, 2, 3, 4), arr(3, 2, 3, 4), arr(3, 2, 3, 4))
    m = headlight.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match=r"batch size.*\[5, 3, 8\]"):
        m(arr(5, 2, 8), arr(5, 3, 8), arr(5, 3, 8))


def test_mismatched_head_dims():
    with pytest.raises(ValueError, match=r"key: 3 heads do not match query's 4 heads.*enable_gqa"):
        headlight.scaled_dot_product_attention(arr(1, 4, 3, 8), arr(1, 3, 3, 8), arr(1, 3, 3, 8))
    with pytest.raises(ValueError, match="must divide"):
        headlight.scaled_dot_product_attention(arr(1, 4, 3, 8), arr(1, 3, 3, 8), arr(1, 3, 3, 8),
                                               enable_gqa=True)
    with pytest.raises(ValueError, match=r"key: last dim 6 must equal query's last dim 8"):
        headlight.scaled_dot_product_attention(arr(1, 4, 3, 8), arr(1, 4, 3, 6), arr(1, 4, 3, 8))
    m = headlight.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query: last dim 6 must equal embed_dim 8"):
        m(arr(5, 1, 6), arr(5, 1, 8), arr(5, 1, 8))


def test_key_value_length_mismatch():
    with pytest.raises(ValueError, match=r"value: length 4 must equal key's length 5"):
        headlight.scaled_dot_product_attention(arr(2, 3, 8), arr(2, 5, 8), arr(2, 4, 8))
    m = headlight.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match=r"value: length must equal key's length 5"):
        m(arr(3, 1, 8), arr(5, 1, 8), arr(4, 1, 8))


def test_wrong_mask_shape_or_dtype():
    q = arr(2, 3, 8)
    with pytest.raises(ValueError, match=r"attn_mask.*\[4, 5\]"):
        headlight.scaled_dot_product_attention(q, arr(2, 5, 8), arr(2, 5, 8), attn_mask=np.ones((4, 5), bool))
    with pytest.raises(ValueError, match=r"attn_mask.*dtype"):
        headlight.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3), np.complex64))
    m = headlight.MultiheadAttention(8, 2)
    x = arr(3, 2, 8)
    with pytest.raises(ValueError, match=r"attn_mask: 2-D shape \[3, 4\] must be \(L, S\) = \(3, 3\)"):
        m(x, x, x, attn_mask=np.zeros((3, 4), bool))
    with pytest.raises(ValueError, match=r"attn_mask.*\(N\*num_heads, L, S\) = \(4, 3, 3\)"):
        m(x, x, x, attn_mask=np.zeros((2, 3, 3), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask: shape \[3, 3\] must be \[2, 3\]"):
        m(x, x, x, key_padding_mask=np.zeros((3, 3), bool))


def test_non_finite_scale():
    q = arr(2, 3, 8)
    for s in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale"):
            headlight.scaled_dot_product_attention(q, q, q, scale=s)


def test_element_count_overflow():
    with pytest.raises(ValueError, match="overflow"):
        headlight.MultiheadAttention(2**40, 1)


def test_not_an_array():
    with pytest.raises(ValueError, match="query"):
        headlight.scaled_dot_product_attention("text", arr(2, 3), arr(2, 3))
    with pytest.raises(ValueError, match="query: expected at least 2 dims"):
        headlight.scaled_dot_product_attention(arr(3), arr(2, 3), arr(2, 3))


def test_state_dict_errors():
    m = headlight.MultiheadAttention(4, 2)
    state = m.state_dict()
    state["out_proj.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"out_proj.weight.*\[3, 4\].*\[4, 4\]"):
        m.load_state_dict(state)
    with pytest.raises(ValueError, match="missing key 'in_proj_bias'"):
        s = m.state_dict()
        del s["in_proj_bias"]
        m.load_state_dict(s)


def test_backward_errors():
    m = headlight.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match="forward first"):
        m.backward(arr(3, 1, 8))
    x = arr(3, 1, 8)
    m(x, x, x)
    with pytest.raises(ValueError, match=r"grad_output: shape \[3, 8\] must equal the output's \[3, 1, 8\]"):
        m.backward(arr(3, 8))
    with pytest.raises(ValueError, match="grad_output"):
        headlight.scaled_dot_product_attention_backward(x, x, x, arr(3, 1, 9))


def test_zero_length_sequences_are_allowed():
    out = headlight.scaled_dot_product_attention(arr(2, 0, 8), arr(2, 5, 8), arr(2, 5, 3))
    assert out.shape == (2, 0, 3)
    out = headlight.scaled_dot_product_attention(arr(2, 4, 8), arr(2, 0, 8), arr(2, 0, 3))
    assert out.shape == (2, 4, 3) and np.all(out == 0)
    m = headlight.MultiheadAttention(8, 2)
    out, w = m(arr(0, 2, 8), arr(3, 2, 8), arr(3, 2, 8))
    assert out.shape == (0, 2, 8) and w.shape == (2, 0, 3)
    out, w = m(arr(4, 2, 8), arr(0, 2, 8), arr(0, 2, 8))
    assert out.shape == (4, 2, 8) and w.shape == (2, 4, 0)
    gq, gk, gv = m.backward(np.ones_like(out))
    assert gk.shape == (0, 2, 8)
