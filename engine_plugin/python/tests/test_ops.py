"""kvpool.ops' argument checks, which run before anything reaches a GPU: every mismatch is a
ValueError that names the argument. Runs everywhere the module was built with CUDA (nvcc), GPU
or not; the numerics are in test_gpu.py."""

import pytest
import torch

import kvpool

pytestmark = pytest.mark.skipif(not getattr(kvpool, "HAS_CUDA", False),
                                reason="kvpool built without nvcc: no kvpool.ops kernels")

if getattr(kvpool, "HAS_CUDA", False):
    import kvpool.ops as ops


def test_gqa_decode_refuses_cpu_tensors_naming_the_argument():
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 4, 16, 2, 128, dtype=torch.bfloat16)
    bt = torch.zeros(2, 4, dtype=torch.int32)
    sl = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^q must be on a CUDA device"):
        ops.gqa_decode(q, cache, bt, sl)


def test_mla_decode_refuses_cpu_tensors_naming_the_argument():
    q = torch.zeros(1, 16, 576, dtype=torch.bfloat16)
    cache = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    bt = torch.zeros(1, 4, dtype=torch.int32)
    sl = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^q must be on a CUDA device"):
        ops.mla_decode(q, cache, bt, sl)


def test_copy_blocks_refuses_bad_arguments_by_name():
    with pytest.raises(ValueError, match=r"^kv_caches must be a non-empty list"):
        ops.copy_blocks([], torch.zeros(1, 16, dtype=torch.uint8), torch.zeros(1), 4, 16)
    with pytest.raises(ValueError, match=r"^kv_caches\[0\] must be on a CUDA device"):
        ops.copy_blocks([torch.zeros(4, 16)], torch.zeros(1, 16, dtype=torch.uint8),
                        torch.zeros(1), 4, 16)


def test_layout_rules_name_the_argument():
    # The stride rules are plain Python over shapes and strides: checked here on CPU tensors.
    cache = torch.zeros(2, 2, 16, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^kv_cache of shape .* is ambiguous"):
        ops._gqa_layout(cache, 64, None, "NHD", False)
    assert ops._gqa_layout(cache, 64, 0, "NHD", False)[0] == (2 * 16 * 4 * 64, 16 * 4 * 64, 256, 64)
    assert ops._gqa_layout(cache, 64, 1, "NHD", False)[0] == (16 * 4 * 64, 2 * 16 * 4 * 64, 256, 64)
    with pytest.raises(ValueError, match=r"^kv_cache's head_dim 64 differs from q's 128"):
        ops._gqa_layout(cache, 128, 0, "NHD", False)
    with pytest.raises(ValueError, match=r"^kv_layout must be"):
        ops._gqa_layout(cache, 64, 0, "XYZ", False)
    packed = torch.zeros(8, 16, 4, 2 * 64, dtype=torch.bfloat16)
    assert ops._gqa_layout(packed, 64, None, "NHD", False)[0] == (64, 16 * 4 * 128, 4 * 128, 128)
    with pytest.raises(ValueError, match=r"^kv_cache of shape .* packed cache's last dimension"):
        ops._gqa_layout(packed, 128, None, "NHD", False)
    hnd = torch.zeros(2, 8, 4, 16, 64, dtype=torch.bfloat16)
    layout, blocks, block_size, heads = ops._gqa_layout(hnd, 64, None, "HND", False)
    assert (layout, blocks, block_size, heads) == ((8 * 4 * 16 * 64, 4 * 16 * 64, 64, 16 * 64),
                                                   8, 16, 4)
    # A view whose head stride (68 elements, 136 bytes) is not a multiple of 16 bytes.
    odd = torch.zeros(2, 8, 16, 4, 68, dtype=torch.bfloat16)[..., :64]
    with pytest.raises(ValueError, match=r"^kv_cache's head stride"):
        ops._gqa_layout(odd, 64, 0, "NHD", False)
