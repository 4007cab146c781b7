"""Mooncake's unified parallelism tensor API (ParallelAxis, TensorParallelism, ReadTarget, the
*_tensor_with_parallelism* calls) against a real kvpool-master: the keys shards are stored
under, the bytes of their headers and manifests (Mooncake's layouts), reads that reassemble or
reshard, and what is refused."""

import ctypes
import struct

import pytest
import torch

import kvpool
from kvpool.store import (MooncakeDistributedStore, ParallelAxis, ReadTarget,
                          TensorParallelism)

INVALID = kvpool.INVALID_PARAMS
HEADER = 304


@pytest.fixture
def mc(pool):
    master = pool.master(embedded_segment_size="0")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "", 32 << 20, 16 << 20, "tcp", "", master) == 0
    yield store
    store.close()


def axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    a.expert_id, a.stage_id = expert_id, stage_id
    return a


def par(*axes):
    p = TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, parallelism=None):
    t = ReadTarget()
    t.mode = mode
    t.parallelism = parallelism
    return t


class Writer:
    def __init__(self, rank, size, split_dim):
        self.rank, self.size, self.split_dim = rank, size, split_dim


def header_fields(raw):
    """(layout_kind, global_shape, local_shape, axes) of a stored tensor object's header."""
    magic, version, size, _dtype, ndim, kind, _, offset, nbytes = struct.unpack_from(
        "<IHHiiIIQQ", raw, 0)
    assert (magic, version, size, offset) == (0x4D4F4F4E, 1, HEADER, HEADER)
    assert len(raw) == HEADER + nbytes
    global_shape = list(struct.unpack_from("<8q", raw, 40))[:ndim]
    local_shape = list(struct.unpack_from("<8q", raw, 104))[:ndim]
    count = struct.unpack_from("<I", raw, 168)[0]
    axes = [struct.unpack_from("<iiiiiiq", raw, 176 + 32 * i) for i in range(count)]
    return kind, global_shape, local_shape, axes


def manifest_fields(raw):
    assert len(raw) == 96
    magic, version, size, _dtype, ndim, split_dim, count, _ = struct.unpack_from("<IHHiiiii",
                                                                               raw, 0)
    assert (magic, version, size) == (0x574D414E, 1, 96)
    return list(struct.unpack_from("<8q", raw, 32))[:ndim], split_dim, count


def test_classes_behave_as_mooncakes_bindings():
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == (
        "", 0, 1, None, None, None)
    p = par(axis("pp", 0, 2), axis("tp", 1, 2, split_dim=0))
    p.axes[0].stage_id = 3  # the stored axis, as pybind's reference to the C++ element
    assert p.axes[0].stage_id == 3
    original = axis("dp", 0, 2)
    q = par(original)
    original.rank = 1  # assignment copied it
    assert q.axes[0].rank == 0
    t = ReadTarget()
    assert (t.mode, t.parallelism) == ("as_stored", None)
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError):
        t.mode = "sideways"


def test_single_tp_axis_stores_the_given_shard_under_the_tp_key(mc):
    full = torch.arange(24, dtype=torch.float32).view(4, 6)
    shards = full.chunk(3, 1)
    for rank, shard in enumerate(shards):
        assert mc.put_tensor_with_parallelism("w", shard.contiguous(),
                                              par(axis("tp", rank, 3, split_dim=1))) == 0
    # The _with_tp calls' keys, Mooncake's header: a shard of a [4, 6] tensor, its TP axis.
    kind, g, l, axes = header_fields(mc.get("w_tp_2"))
    assert (kind, g, l) == (1, [4, 6], [4, 2])
    assert axes == [(1, 0, 2, 3, 1, 0, 2)]
    assert manifest_fields(mc.get("w__parallelism_manifest")) == ([4, 6], 1, 3)
    assert torch.equal(mc.get_tensor_with_tp("w", tp_rank=1, tp_size=3), shards[1])
    for rank in range(3):
        got = mc.get_tensor_with_parallelism("w", target("shard", par(axis("tp", rank, 3, 1))))
        assert torch.equal(got, shards[rank])
    assert torch.equal(mc.get_tensor_with_parallelism(
        "w", target("full", par(axis("tp", 0, 3, split_dim=1)))), full)


def test_multi_axis_cuts_the_shard_from_the_whole_tensor(mc):
    full = torch.arange(48, dtype=torch.int32).view(6, 8)
    for rank in range(2):
        p = par(axis("pp", 0, 2, stage_id=7), axis("tp", rank, 2, split_dim=0))
        assert mc.put_tensor_with_parallelism("m", full, p) == 0
    # Canonical axis order in the key (dp, tp, ep, pp); the caller's order in the header.
    raw = mc.get("m__tp_1of2_sd0__pp_0of2_sid7")
    kind, g, l, axes = header_fields(raw)
    assert (kind, g, l) == (1, [6, 8], [3, 8])
    assert axes == [(3, 0, 0, 2, -1, 7, 0), (1, 1, 1, 2, 0, 0, 3)]
    assert torch.equal(torch.frombuffer(bytearray(raw[HEADER:]), dtype=torch.int32).view(3, 8),
                       full[3:])
    reader = par(axis("tp", 1, 2, split_dim=0), axis("pp", 0, 2, stage_id=7))  # any order
    assert torch.equal(mc.get_tensor_with_parallelism("m", target("shard", reader)), full[3:])
    assert torch.equal(mc.get_tensor_with_parallelism("m", target("full", reader)), full)
    # Another stage's shards were never written.
    other = par(axis("pp", 1, 2, stage_id=7), axis("tp", 1, 2, split_dim=0))
    assert mc.get_tensor_with_parallelism("m", target("shard", other)) is None


def test_reads_reshard_to_another_tp_size(mc):
    full = torch.arange(64, dtype=torch.float32).view(8, 8)
    for rank, shard in enumerate(full.chunk(2, 0)):
        assert mc.put_tensor_with_parallelism("r", shard.contiguous(),
                                              par(axis("tp", rank, 2, split_dim=0))) == 0
    for rank in range(4):  # a TP-4 reader of TP-2 shards
        got = mc.get_tensor_with_parallelism("r", target("shard", par(axis("tp", rank, 4, 0))))
        assert torch.equal(got, full.chunk(4, 0)[rank])
    # Split along another dimension: no shard fits (and r_tp_2 was never written).
    assert mc.get_tensor_with_parallelism("r", target("shard", par(axis("tp", 2, 4, 1)))) is None


def test_writer_partitions_reassemble_in_full(mc):
    full = torch.arange(32, dtype=torch.float64).view(4, 8)
    for rank in range(4):
        assert mc.put_tensor_with_parallelism("p", full, writer_partition=Writer(rank, 4, 1)) == 0
    kind, g, l, axes = header_fields(mc.get("p__writer_3of4_sd1"))
    assert (kind, g, l, axes) == (1, [4, 8], [4, 2], [(1, 0, 3, 4, 1, 0, 2)])
    assert manifest_fields(mc.get("p__writer_manifest")) == ([4, 8], 1, 4)
    assert torch.equal(mc.get_tensor_with_parallelism("p", target("full")), full)
    got = mc.get_tensor_with_parallelism("p", target("shard", par(axis("tp", 2, 4, 1))))
    assert torch.equal(got, full[:, 4:6])
    assert mc.remove("p__writer_2of4_sd1", True) == 0  # a missing shard: no partial tensor
    assert mc.get_tensor_with_parallelism("p", target("full")) is None


def test_axes_without_tp_and_plain_calls(mc):
    t = torch.arange(6, dtype=torch.int64).view(2, 3)
    assert mc.put_tensor_with_parallelism("e", t, par(axis("ep", 1, 4, expert_id=11))) == 0
    kind, g, l, axes = header_fields(mc.get("e__ep_1of4_eid11"))
    assert (kind, g, l, axes) == (1, [2, 3], [2, 3], [(2, 0, 1, 4, -1, 11, 0)])
    assert mc.is_exist("e__parallelism_manifest") == 0
    got = mc.get_tensor_with_parallelism("e", target("shard", par(axis("ep", 1, 4, expert_id=11))))
    assert torch.equal(got, t)
    assert mc.put_tensor_with_parallelism("plain", t) == 0  # no parallelism: put_tensor
    assert torch.equal(mc.get_tensor("plain"), t)
    assert torch.equal(mc.get_tensor_with_parallelism("plain"), t)
    assert mc.batch_put_tensor_with_parallelism(["b0", "b1"], [t, t + 1]) == [0, 0]
    assert [x.tolist() for x in mc.batch_get_tensor_with_parallelism(["b0", "b1"])] == [
        t.tolist(), (t + 1).tolist()]


def test_refusals(mc):
    t = torch.zeros(2, 3)
    for bad in (par(axis("dp", 0, 2, split_dim=0)),  # DP takes no split_dim
                par(axis("ep", 0, 2)),  # EP needs expert_id
                par(axis("pp", 0, 2)),  # PP needs stage_id
                par(axis("tp", 0, 2)),  # TP needs split_dim
                par(axis("tp", 2, 2, split_dim=0)),  # rank out of range
                par(axis("tp", 0, 2, 0), axis("tp", 1, 2, 0)),  # duplicate kinds
                par(axis("xp", 0, 2)),
                par(),
                par(axis("dp", 0, 2), axis("tp", 0, 2, split_dim=1))):  # 3 does not split 2 ways
        assert mc.put_tensor_with_parallelism("x", t, bad) == INVALID, bad
    assert mc.put_tensor_with_parallelism("x", t, writer_partition=Writer(0, 2, 1)) == INVALID
    assert mc.put_tensor_with_parallelism("x", t, par(axis("tp", 0, 2, 0)),
                                          writer_partition=Writer(0, 2, 0)) == INVALID
    assert mc.batch_put_tensor_with_parallelism(
        ["x", "y"], [t, t], [par(axis("tp", 0, 2, 0))] * 2,
        writer_partitions=[Writer(0, 2, 0)] * 2) == [INVALID, INVALID]
    assert mc.batch_put_tensor_with_parallelism(["x"], [t, t]) == [INVALID]
    assert mc.remove_all() == 0  # nothing was written
    assert mc.get_tensor_with_parallelism("x", target("full", par(axis("dp", 0, 2)))) is None


def test_from_buffer_and_into_buffer(mc):
    full = torch.arange(16, dtype=torch.float32).view(4, 4)
    assert mc.put_tensor("seed", full) == 0
    n = HEADER + full.numel() * 4
    src = (ctypes.c_ubyte * n)()
    src_ptr = ctypes.addressof(src)
    assert mc.register_buffer(src_ptr, n) == 0
    assert mc.get_tensor_into("seed", src_ptr, n) is not None
    # With a TP axis, the _from form stores every TP rank's shard of the buffer's tensor.
    p = par(axis("dp", 1, 2), axis("tp", 0, 2, split_dim=1))
    assert mc.put_tensor_with_parallelism_from("f", src_ptr, n, p) == 0
    assert mc.is_exist("f__dp_1of2__tp_0of2_sd1") == 1
    assert mc.is_exist("f__dp_1of2__tp_1of2_sd1") == 1
    dst = (ctypes.c_ubyte * 4096)()
    dst_ptr = ctypes.addressof(dst)
    assert mc.register_buffer(dst_ptr, 4096) == 0
    p1 = par(axis("dp", 1, 2), axis("tp", 1, 2, split_dim=1))
    got = mc.get_tensor_with_parallelism_into("f", dst_ptr, 4096, target("shard", p1))
    assert torch.equal(got, full[:, 2:])
    got[0, 0] = -1.0  # a tensor over the buffer's bytes
    assert struct.unpack_from("<f", bytes(dst), HEADER)[0] == -1.0
    whole = mc.get_tensor_with_parallelism_into("f", dst_ptr, 4096, target("full", p1))
    assert torch.equal(whole, full)
    assert header_fields(bytes(dst)[:HEADER + 64])[:3] == (0, [4, 4], [4, 4])
    assert mc.get_tensor_with_parallelism_into("f", dst_ptr, 100, target("full", p1)) is None
    unregistered = (ctypes.c_ubyte * 4096)()
    assert mc.get_tensor_with_parallelism_into("f", ctypes.addressof(unregistered), 4096,
                                               target("full", p1)) is None
    assert mc.batch_get_tensor_with_parallelism_into(
        ["f", "nope"], [dst_ptr, dst_ptr + 2048], [2048, 2048],
        [target("shard", p1), target("shard", p1)])[1] is None
    # Upserts replace every shard and the manifest.
    assert mc.upsert_tensor_with_parallelism("f", full + 1, p1) == 0
    assert torch.equal(mc.get_tensor_with_parallelism("f", target("shard", p1)),
                       (full + 1)[:, 2:])
    assert mc.batch_upsert_tensor_with_parallelism_from(["g"], [src_ptr], [n]) == [0]
    assert mc.unregister_buffer(src_ptr) == 0 and mc.unregister_buffer(dst_ptr) == 0
