"""Layout detection from torch tensors, keys and address arithmetic (no servers needed)."""

import pytest
import torch

import kvpool

NUM_BLOCKS = 10
BLOCK_SIZE = 16
HEADS = 4
HEAD_DIM = 8


def storage_ptr(t):
    return kvpool.describe_tensor(t).storage_ptr


def test_flash_attention_kv_outer_gives_two_segments():
    t = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, dtype=torch.float16)
    layout = kvpool.detect_layout({"layer0": t}, NUM_BLOCKS, BLOCK_SIZE)
    seg_stride = t.stride(0) * t.element_size()
    assert layout.kv_caches_base_addr == [t.data_ptr(), t.data_ptr() + seg_stride]
    assert layout.block_len == [seg_stride // NUM_BLOCKS] * 2
    assert [(r.base, r.bytes) for r in layout.regions] == [(t.data_ptr(), t.numel() * 2)]


def test_flash_attention_hnd_permuted_view():
    physical = torch.zeros(2, NUM_BLOCKS, HEADS, BLOCK_SIZE, HEAD_DIM, dtype=torch.bfloat16)
    t = physical.permute(0, 1, 3, 2, 4)  # logical (2, N, block_size, heads, head_dim)
    layout = kvpool.detect_layout([t], NUM_BLOCKS, BLOCK_SIZE)
    page_kv = BLOCK_SIZE * HEADS * HEAD_DIM * 2
    assert layout.block_len == [page_kv, page_kv]
    assert layout.kv_caches_base_addr[1] - layout.kv_caches_base_addr[0] == NUM_BLOCKS * page_kv


def test_flashinfer_mla_and_packed_kv_give_one_segment():
    flashinfer = torch.zeros(NUM_BLOCKS, 2, BLOCK_SIZE, HEADS, HEAD_DIM, dtype=torch.float16)
    mla = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 576, dtype=torch.bfloat16)
    packed = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HEADS, 2 * HEAD_DIM, dtype=torch.float16)
    for t in (flashinfer, mla, packed):
        layout = kvpool.detect_layout(t, NUM_BLOCKS, BLOCK_SIZE)
        assert layout.kv_caches_base_addr == [t.data_ptr()]
        assert layout.block_len == [t.numel() * t.element_size() // NUM_BLOCKS]
        assert len(layout.regions) == 1


def test_cross_layer_tensor_is_one_segment_of_every_layer():
    layers, per_layer_page = 4, 64
    t = torch.zeros(NUM_BLOCKS, layers * per_layer_page, dtype=torch.float16)
    layout = kvpool.detect_layout(t, NUM_BLOCKS, BLOCK_SIZE)
    assert layout.kv_caches_base_addr == [storage_ptr(t)]
    assert layout.block_len == [layers * per_layer_page * 2]
    assert layout.bytes_per_block == layers * per_layer_page * 2


def test_layers_sharing_a_storage_register_it_once():
    whole = torch.zeros(3, 2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, dtype=torch.float16)
    layers = {f"layer{i}": whole[i] for i in range(3)}
    layout = kvpool.detect_layout(layers, NUM_BLOCKS, BLOCK_SIZE)
    page_kv = BLOCK_SIZE * HEADS * HEAD_DIM * 2
    assert len(layout.segments) == 6
    assert layout.kv_caches_base_addr == [whole.data_ptr() + i * NUM_BLOCKS * page_kv
                                          for i in range(6)]
    assert [(r.base, r.bytes) for r in layout.regions] == [(whole.data_ptr(), whole.numel() * 2)]


def test_refused_layouts_say_why():
    with pytest.raises(ValueError, match="does not divide into 10 blocks"):
        kvpool.detect_layout(torch.zeros(NUM_BLOCKS * 33 + 1, dtype=torch.uint8), NUM_BLOCKS,
                             BLOCK_SIZE)
    with pytest.raises(ValueError, match="not a multiple of the block size of 16"):
        kvpool.detect_layout(torch.zeros(NUM_BLOCKS, 24, dtype=torch.uint8), NUM_BLOCKS,
                             BLOCK_SIZE)
    with pytest.raises(ValueError, match="both stride past a page"):
        kvpool.detect_layout(torch.zeros(2, 3, NUM_BLOCKS, 16, dtype=torch.float16), NUM_BLOCKS,
                             BLOCK_SIZE)
    interleaved = torch.zeros(NUM_BLOCKS, 2, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="extends past the end of its storage"):
        kvpool.detect_layout({"layer1": interleaved[:, 1]}, NUM_BLOCKS, BLOCK_SIZE)
    with pytest.raises(TypeError):
        kvpool.detect_layout([object()], NUM_BLOCKS, BLOCK_SIZE)


def test_plain_descriptions_work_like_tensors():
    desc = kvpool.TensorDesc(data_ptr=0x1000, storage_ptr=0x1000, storage_bytes=NUM_BLOCKS * 512,
                             shape=[NUM_BLOCKS, 256], strides=[256, 1], element_size=2,
                             name="layer0")
    layout = kvpool.detect_layout([desc], NUM_BLOCKS, BLOCK_SIZE)
    assert layout.kv_caches_base_addr == [0x1000]
    assert layout.block_len == [512]


def test_keys_match_mooncake_store_connector():
    meta = kvpool.KeyMetadata("test-model", tp_rank=1, pcp_rank=0, dcp_rank=2, pp_rank=3)
    assert kvpool.pool_key(meta, b"a0") == "test-model@tp_rank:1@pcp0@dcp2@pp_rank:3@6130"
    assert kvpool.pool_key(meta, "cafe") == "test-model@tp_rank:1@pcp0@dcp2@pp_rank:3@cafe"
    assert kvpool.model_key_name("meta-llama/Llama-3.1-8B/") == "Llama-3.1-8B"


def test_token_database_ranges_and_addresses():
    t = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, dtype=torch.float16)
    layout = kvpool.detect_layout([t], NUM_BLOCKS, BLOCK_SIZE)
    db = kvpool.TokenDatabase(kvpool.KeyMetadata("m"), BLOCK_SIZE)
    db.set_layout(layout)
    hashes = [b"\x00\x01", b"\x02\x03", b"\x04\x05"]
    assert db.process_tokens(40, hashes) == [
        (0, 16, "m@tp_rank:0@pcp0@dcp0@pp_rank:0@0001"),
        (16, 32, "m@tp_rank:0@pcp0@dcp0@pp_rank:0@0203"),
        (32, 40, "m@tp_rank:0@pcp0@dcp0@pp_rank:0@0405"),
    ]
    assert [c[0] for c in db.process_tokens(48, hashes, mask_num=16)] == [16, 32]

    page_kv = BLOCK_SIZE * HEADS * HEAD_DIM * 2
    addrs, sizes, block_id = db.prepare_value(16, 32, [7, 4, 9])
    assert block_id == 4
    assert addrs == [t.data_ptr() + 4 * page_kv, t.data_ptr() + NUM_BLOCKS * page_kv + 4 * page_kv]
    assert sizes == [page_kv, page_kv]
    _, partial, _ = db.prepare_value(32, 40, [7, 4, 9])
    assert partial == [page_kv // BLOCK_SIZE * 8] * 2
    with pytest.raises(ValueError, match="outside the 10 registered blocks"):
        db.prepare_value(0, 16, [10])

    assert kvpool.TokenDatabase.plan_save(40, 0, 16, True) == (True, 32)
    assert kvpool.TokenDatabase.plan_save(47, 32, 16, True) == (False, 32)
    assert kvpool.TokenDatabase.plan_save(40, 0, 16, False) == (True, 40)
