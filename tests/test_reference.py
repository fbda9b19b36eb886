import pytest
import torch
import torch.nn.functional as F

from flashcore_nb.reference import attention_fp64, causal_mask, chunked_online_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(64, 64), (17, 40), (40, 17), (1, 1)])
def test_reference_matches_torch_math_in_fp64(sq, sk, causal):
    q, k, v = torch.randn(2, 3, sq, 64), torch.randn(2, 3, sk, 64), torch.randn(2, 3, sk, 64)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert torch.allclose(attention_fp64(q, k, v, causal=causal), expected, rtol=0, atol=1e-12)


def test_reference_honours_scale():
    q, k, v = (torch.randn(1, 1, 8, 64) for _ in range(3))
    a, b = attention_fp64(q, k, v, scale=0.5), attention_fp64(q, k, v)
    assert not torch.allclose(a, b)
    assert torch.allclose(a, attention_fp64(q * 4, k, v), atol=1e-12)  # 0.5 = 4 x 1/sqrt(64)


def test_causal_mask_is_top_left_aligned():
    mask = causal_mask(3, 5)
    assert mask.tolist() == [[True, False, False, False, False],
                             [True, True, False, False, False],
                             [True, True, True, False, False]]


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_online_softmax_is_the_same_function(causal):
    q, k, v = (torch.randn(1, 2, 300, 64) * 3 for _ in range(3))
    err = (chunked_online_attention(q, k, v, chunk=128, causal=causal) - attention_fp64(q, k, v, causal)).abs().max()
    assert err < 1e-4  # float32 rounding over 300 keys


@pytest.mark.parametrize("causal", [False, True])
def test_reference_in_query_blocks_is_the_same_function(causal, monkeypatch):
    from flashcore_nb import reference
    q, k, v = torch.randn(2, 3, 50, 64), torch.randn(2, 3, 40, 64), torch.randn(2, 3, 40, 64)
    whole = attention_fp64(q, k, v, causal=causal)
    monkeypatch.setattr(reference, "MAX_SCORE_ELEMENTS", 2 * 3 * 40 * 7)   # blocks of 7 query rows
    assert torch.allclose(attention_fp64(q, k, v, causal=causal), whole, rtol=0, atol=1e-12)
