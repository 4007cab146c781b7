"""kvpool's CUDA kernels as torch operations, in the style of FlashInfer's Python API.

    import kvpool.ops as ops
    o = ops.gqa_decode(q, kv_cache, block_tables, seq_lens)        # paged GQA, one decode step
    o = ops.mla_decode(q, kv_cache, block_tables, seq_lens)        # DeepSeek MLA latent cache
    ops.copy_blocks(kv_caches, blocks, block_ids, num_blocks, block_size, to_cache=False)

Torch tensors in and out, on the current torch stream; layouts come from the tensors' strides.
Every shape, dtype, device or stride mismatch is a ValueError that names the argument. With
torch >= 2.4 the three are registered as torch.library custom ops (torch.ops.kvpool.*), with
fake implementations, so torch.compile traces through them and CUDA graphs capture them (the
decode kernels' launch plan is made once per shape, outside the capture, and reused).

Layouts of `kv_cache` for gqa_decode (NB blocks of BS tokens, H kv heads, D = q's head_dim):
  (2, NB, BS, H, D)   K/V first (FlashAttention, vLLM)       kv_dim=0
  (NB, 2, BS, H, D)   blocks first (FlashInfer)              kv_dim=1
  (NB, BS, H, 2 * D)  K and V packed in the last dimension
  with kv_layout="HND" the token and head dimensions swap, as in FlashInfer.
Any strides are fine as long as rows of D elements are contiguous and every stride is a multiple
of 16 bytes.
"""

import math
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from kvpool import _kvpool

__all__ = ["gqa_decode", "mla_decode", "copy_blocks", "HAS_OPS"]

#: Whether the kernels are in this build of the module (built where nvcc was).
HAS_OPS = bool(getattr(_kvpool, "HAS_CUDA", False))

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
if hasattr(torch, "float8_e4m3fn"):
    _DTYPES[torch.float8_e4m3fn] = "fp8_e4m3"

MLA_K_DIM = 576
MLA_V_DIM = 512


# --- argument checks -----------------------------------------------------------------------


def _itemsize(t: torch.Tensor) -> int:
    # dtype.itemsize (torch >= 2.1) is a constant to torch.compile; element_size() is the
    # fallback for older torch.
    size = getattr(t.dtype, "itemsize", None)
    return int(size) if size is not None else t.element_size()


def _need_cuda(name: str, t: torch.Tensor, device: Optional[torch.device] = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, not {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}: all tensors on one device")


def _need_dtype(name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; expected {names}")


def _need_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {tuple(t.stride())})")


def _check_tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, batch: int,
                  device: torch.device) -> int:
    _need_cuda("block_tables", block_tables, device)
    _need_cuda("seq_lens", seq_lens, device)
    _need_dtype("block_tables", block_tables, [torch.int32])
    _need_dtype("seq_lens", seq_lens, [torch.int32])
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [batch={batch}, max_blocks_per_seq], "
                         f"not {list(block_tables.shape)}")
    if seq_lens.dim() != 1 or seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must be [batch={batch}], not {list(seq_lens.shape)}")
    _need_contiguous("block_tables", block_tables)
    _need_contiguous("seq_lens", seq_lens)
    return int(block_tables.shape[1])


def _gqa_layout(kv_cache: torch.Tensor, head_dim: int, kv_dim: Optional[int],
                kv_layout: str, check_ptr: bool) -> Tuple[Tuple[int, int, int, int], int, int, int]:
    """(v_offset, block_stride, token_stride, head_stride) in elements, num_blocks, block_size,
    num_kv_heads, from kv_cache's shape and strides."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', not {kv_layout!r}")
    shape, stride = list(kv_cache.shape), list(kv_cache.stride())
    if kv_cache.dim() == 5:
        if kv_dim is None:
            if shape[0] == 2 and shape[1] != 2:
                kv_dim = 0
            elif shape[1] == 2 and shape[0] != 2:
                kv_dim = 1
            else:
                raise ValueError(f"kv_cache of shape {shape} is ambiguous: say which dimension "
                                 "holds K/V with kv_dim=0 (K/V first) or kv_dim=1 (blocks first)")
        if kv_dim not in (0, 1) or shape[kv_dim] != 2:
            raise ValueError(f"kv_cache: dimension kv_dim={kv_dim} of shape {shape} is not the "
                             "K/V pair (size 2)")
        block_dim = 1 - kv_dim
        v_offset, block_stride = stride[kv_dim], stride[block_dim]
        num_blocks = shape[block_dim]
        a, b = 2, 3  # token, head in NHD order
        if kv_layout == "HND":
            a, b = 3, 2
        block_size, heads = shape[a], shape[b]
        token_stride, head_stride = stride[a], stride[b]
        if shape[4] != head_dim:
            raise ValueError(f"kv_cache's head_dim {shape[4]} differs from q's {head_dim}")
        if stride[4] != 1:
            raise ValueError(f"kv_cache's last dimension must be contiguous (strides {stride})")
    elif kv_cache.dim() == 4:
        if shape[3] != 2 * head_dim:
            raise ValueError(f"kv_cache of shape {shape}: a packed cache's last dimension holds "
                             f"K and V (2 * head_dim = {2 * head_dim}), not {shape[3]}")
        if stride[3] != 1:
            raise ValueError(f"kv_cache's last dimension must be contiguous (strides {stride})")
        a, b = (1, 2) if kv_layout == "NHD" else (2, 1)
        num_blocks, block_size, heads = shape[0], shape[a], shape[b]
        v_offset, block_stride = head_dim, stride[0]
        token_stride, head_stride = stride[a], stride[b]
    else:
        raise ValueError(f"kv_cache must be 5-D (K/V first or blocks first) or 4-D (K/V packed), "
                         f"not of shape {shape}")
    elem = _itemsize(kv_cache)
    for what, s in (("v_offset", v_offset), ("block stride", block_stride),
                    ("token stride", token_stride), ("head stride", head_stride)):
        if (s * elem) % 16 != 0:
            raise ValueError(f"kv_cache's {what} ({s} elements) is not a multiple of 16 bytes")
    if check_ptr and kv_cache.data_ptr() % 16 != 0:  # real tensors only (not while tracing)
        raise ValueError("kv_cache must be 16-byte aligned")
    return (v_offset, block_stride, token_stride, head_stride), num_blocks, block_size, heads


# --- launch plans ------------------------------------------------------------------------

# One plan and workspace per (kernel, shape, types, max_seq_len, device, stream): a decode
# step's layers share it, and graph replays reuse what was planned before the capture.
_plans: Dict[tuple, tuple] = {}
_plans_lock = threading.Lock()


def _capturing() -> bool:
    return bool(torch.cuda.is_current_stream_capturing())


def _plan(kind: str, key: tuple, workspace_bytes, make_plan):
    stream = torch.cuda.current_stream()
    full_key = (kind, key, stream.device, stream.cuda_stream)
    with _plans_lock:
        hit = _plans.get(full_key)
    if hit is not None:
        return hit
    if _capturing():
        raise RuntimeError(f"kvpool.ops.{kind}: no launch plan for this shape yet; run the op "
                           "once outside CUDA graph capture (warm-up) first")
    nbytes = workspace_bytes()
    workspace = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=stream.device)
    plan = make_plan(workspace.data_ptr(), workspace.numel(), stream.cuda_stream)
    with _plans_lock:
        _plans[full_key] = (plan, workspace)
    return plan, workspace


# --- GQA decode --------------------------------------------------------------------------


def _gqa_check(q, kv_cache, block_tables, seq_lens, kv_dim, kv_layout, check_ptr=False):
    _need_cuda("q", q)
    device = q.device
    _need_cuda("kv_cache", kv_cache, device)
    _need_dtype("q", q, [torch.bfloat16, torch.float16])
    _need_dtype("kv_cache", kv_cache, [q.dtype] + ([torch.float8_e4m3fn]
                                                   if hasattr(torch, "float8_e4m3fn") else []))
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_qo_heads, head_dim], not {list(q.shape)}")
    _need_contiguous("q", q)
    batch, qo_heads, head_dim = q.shape
    layout, _, block_size, kv_heads = _gqa_layout(kv_cache, head_dim, kv_dim, kv_layout, check_ptr)
    if qo_heads % kv_heads != 0:
        raise ValueError(f"q has {qo_heads} heads, not a multiple of kv_cache's {kv_heads}")
    max_blocks = _check_tables(block_tables, seq_lens, batch, device)
    return batch, qo_heads, kv_heads, head_dim, block_size, max_blocks, layout


def _gqa_impl(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, max_seq_len: int, sm_scale: float, k_scale: float,
              v_scale: float, kv_dim: int, kv_layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    batch, qo_heads, kv_heads, head_dim, block_size, max_blocks, layout = _gqa_check(
        q, kv_cache, block_tables, seq_lens, None if kv_dim < 0 else kv_dim, kv_layout, True)
    if max_seq_len <= 0:
        max_seq_len = max_blocks * block_size
    qt, kt = _DTYPES[q.dtype], _DTYPES[kv_cache.dtype]
    args = (batch, qo_heads, kv_heads, head_dim, block_size, max_blocks, qt, kt, max_seq_len)
    plan, _ = _plan(
        "gqa_decode", args, lambda: _kvpool._gqa_decode_workspace_bytes(*args),
        lambda ws, n, s: _kvpool._gqa_decode_plan(*args, ws, n, s))
    o = torch.empty_like(q)
    lse = torch.empty(batch, qo_heads, dtype=torch.float32, device=q.device)
    _kvpool._gqa_decode_run(plan, q.data_ptr(), kv_cache.data_ptr(), layout,
                            block_tables.data_ptr(), seq_lens.data_ptr(), sm_scale, k_scale,
                            v_scale, o.data_ptr(), lse.data_ptr(),
                            torch.cuda.current_stream().cuda_stream)
    return o, lse


def _gqa_fake(q, kv_cache, block_tables, seq_lens, max_seq_len, sm_scale, k_scale, v_scale,
              kv_dim, kv_layout):
    return torch.empty_like(q), q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)


# --- MLA decode --------------------------------------------------------------------------


def _mla_check(q, kv_cache, block_tables, seq_lens, check_ptr=False):
    _need_cuda("q", q)
    device = q.device
    _need_cuda("kv_cache", kv_cache, device)
    _need_dtype("q", q, [torch.bfloat16, torch.float16])
    _need_dtype("kv_cache", kv_cache, [q.dtype] + ([torch.float8_e4m3fn]
                                                   if hasattr(torch, "float8_e4m3fn") else []))
    if q.dim() != 3 or q.shape[2] != MLA_K_DIM:
        raise ValueError(f"q must be [batch, num_heads, {MLA_K_DIM}], not {list(q.shape)}")
    _need_contiguous("q", q)
    if kv_cache.dim() != 3 or kv_cache.shape[2] != MLA_K_DIM:
        raise ValueError(f"kv_cache must be [num_blocks, block_size, {MLA_K_DIM}], "
                         f"not {list(kv_cache.shape)}")
    if kv_cache.stride(2) != 1 or kv_cache.stride(1) != MLA_K_DIM:
        raise ValueError(f"kv_cache's rows must be dense (strides {tuple(kv_cache.stride())}, "
                         f"expected (*, {MLA_K_DIM}, 1))")
    if (kv_cache.stride(0) * _itemsize(kv_cache)) % 16 != 0 or (
            check_ptr and kv_cache.data_ptr() % 16):
        raise ValueError("kv_cache's block stride and address must be multiples of 16 bytes")
    batch, heads, _ = q.shape
    max_blocks = _check_tables(block_tables, seq_lens, batch, device)
    return batch, heads, int(kv_cache.shape[1]), max_blocks, int(kv_cache.stride(0))


def _mla_impl(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, max_seq_len: int, sm_scale: float, k_scale: float,
              v_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    batch, heads, block_size, max_blocks, block_stride = _mla_check(q, kv_cache, block_tables,
                                                                    seq_lens, True)
    if max_seq_len <= 0:
        max_seq_len = max_blocks * block_size
    args = (batch, heads, block_size, max_blocks, block_stride, _DTYPES[q.dtype],
            _DTYPES[kv_cache.dtype], max_seq_len)
    plan, _ = _plan(
        "mla_decode", args, lambda: _kvpool._mla_decode_workspace_bytes(*args),
        lambda ws, n, s: _kvpool._mla_decode_plan(*args, ws, n, s))
    o = q.new_empty(batch, heads, MLA_V_DIM)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=q.device)
    _kvpool._mla_decode_run(plan, q.data_ptr(), kv_cache.data_ptr(), block_tables.data_ptr(),
                            seq_lens.data_ptr(), sm_scale, k_scale, v_scale, o.data_ptr(),
                            lse.data_ptr(), torch.cuda.current_stream().cuda_stream)
    return o, lse


def _mla_fake(q, kv_cache, block_tables, seq_lens, max_seq_len, sm_scale, k_scale, v_scale):
    return (q.new_empty(q.shape[0], q.shape[1], MLA_V_DIM),
            q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32))


# --- block copies ------------------------------------------------------------------------


def _copy_check(kv_caches, blocks, block_ids, num_blocks, block_size):
    if not isinstance(kv_caches, (list, tuple)) or not kv_caches:
        raise ValueError("kv_caches must be a non-empty list of CUDA tensors")
    for i, t in enumerate(kv_caches):
        _need_cuda(f"kv_caches[{i}]", t, kv_caches[0].device)
    if not isinstance(blocks, torch.Tensor):
        raise ValueError("blocks must be a torch.Tensor")
    if blocks.device.type == "cpu" and not blocks.is_pinned():
        raise ValueError("blocks must be in pinned host memory (pin_memory()) or on the GPU")
    if blocks.dim() != 2 or blocks.dtype != torch.uint8:
        raise ValueError(f"blocks must be a uint8 tensor [n, bytes_per_block], not "
                         f"{str(blocks.dtype).replace('torch.', '')} {list(blocks.shape)}")
    _need_contiguous("blocks", blocks)
    if not isinstance(block_ids, torch.Tensor) or block_ids.device.type != "cpu":
        raise ValueError("block_ids must be a CPU tensor (the launch reads it on the host)")
    _need_dtype("block_ids", block_ids, [torch.int32, torch.int64])
    if block_ids.dim() != 1 or block_ids.shape[0] != blocks.shape[0]:
        raise ValueError(f"block_ids must be [n={blocks.shape[0]}], not {list(block_ids.shape)}")
    ids = block_ids.tolist()
    if ids and (min(ids) < 0 or max(ids) >= num_blocks):
        raise ValueError(f"block_ids must lie in [0, num_blocks={num_blocks})")
    try:
        layout = _kvpool.detect_layout(list(kv_caches), num_blocks, block_size)
    except ValueError as e:
        raise ValueError(f"kv_caches: {e}") from None
    if blocks.shape[1] != layout.bytes_per_block:
        raise ValueError(f"blocks' rows have {blocks.shape[1]} bytes, a block of kv_caches "
                         f"{layout.bytes_per_block}")
    return layout, ids


def _copy_impl(kv_caches: List[torch.Tensor], blocks: torch.Tensor, block_ids: torch.Tensor,
               num_blocks: int, block_size: int, to_cache: bool) -> None:
    layout, ids = _copy_check(kv_caches, blocks, block_ids, num_blocks, block_size)
    if not ids:
        return
    _kvpool._copy_blocks(layout.kv_caches_base_addr, layout.block_len, ids, blocks.data_ptr(),
                         blocks.stride(0), to_cache, torch.cuda.current_stream().cuda_stream)


# --- registration ------------------------------------------------------------------------

_CUSTOM_OPS = HAS_OPS and hasattr(torch, "library") and hasattr(torch.library, "custom_op")

if _CUSTOM_OPS:
    _gqa_op = torch.library.custom_op("kvpool::gqa_decode", mutates_args=())(_gqa_impl)
    _gqa_op.register_fake(_gqa_fake)
    _mla_op = torch.library.custom_op("kvpool::mla_decode", mutates_args=())(_mla_impl)
    _mla_op.register_fake(_mla_fake)
    _copy_op = torch.library.custom_op("kvpool::copy_blocks",
                                       mutates_args=("kv_caches", "blocks"))(_copy_impl)

    @_copy_op.register_fake
    def _copy_fake(kv_caches, blocks, block_ids, num_blocks, block_size, to_cache):
        return None
else:  # torch before 2.4 (no custom_op): the same functions, called directly
    _gqa_op, _mla_op, _copy_op = _gqa_impl, _mla_impl, _copy_impl


def _need_ops() -> None:
    if not HAS_OPS:
        raise RuntimeError("this kvpool module was built without CUDA (no nvcc where it was "
                           "built): kvpool.ops needs its kernels")


def gqa_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor, *, max_seq_len: Optional[int] = None,
               sm_scale: Optional[float] = None, k_scale: float = 1.0, v_scale: float = 1.0,
               kv_dim: Optional[int] = None, kv_layout: str = "NHD", return_lse: bool = False):
    """Paged grouped-query attention for one decode step.

    q: [batch, num_qo_heads, head_dim] (bf16/fp16, contiguous); kv_cache: one of the layouts in
    the module's doc (q's dtype, or float8_e4m3fn with k_scale/v_scale); block_tables:
    [batch, max_blocks_per_seq] int32; seq_lens: [batch] int32 (all on q's device).
    max_seq_len: an upper bound of seq_lens used to plan the launch (default: the block
    table's capacity). sm_scale defaults to 1/sqrt(head_dim). Returns o [batch, num_qo_heads,
    head_dim] (and lse [batch, num_qo_heads], float32 natural log, with return_lse).
    """
    _need_ops()
    _gqa_check(q, kv_cache, block_tables, seq_lens, kv_dim, kv_layout)  # errors before dispatch
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    o, lse = _gqa_op(q, kv_cache, block_tables, seq_lens, int(max_seq_len or 0), float(sm_scale),
                     float(k_scale), float(v_scale), -1 if kv_dim is None else int(kv_dim),
                     kv_layout)
    return (o, lse) if return_lse else o


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor, *, max_seq_len: Optional[int] = None,
               sm_scale: Optional[float] = None, k_scale: float = 1.0, v_scale: float = 1.0,
               return_lse: bool = False):
    """MLA (DeepSeek V2/V3) decode over a paged latent cache.

    q: [batch, num_heads, 576] (latent 512 + rotary 64; 16..128 heads, a multiple of 16);
    kv_cache: [num_blocks, block_size, 576] with dense rows; block_tables, seq_lens as for
    gqa_decode. sm_scale defaults to 1/sqrt(576). Returns o [batch, num_heads, 512] (and lse).
    """
    _need_ops()
    _mla_check(q, kv_cache, block_tables, seq_lens)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(MLA_K_DIM)
    o, lse = _mla_op(q, kv_cache, block_tables, seq_lens, int(max_seq_len or 0), float(sm_scale),
                     float(k_scale), float(v_scale))
    return (o, lse) if return_lse else o


def copy_blocks(kv_caches: Sequence[torch.Tensor], blocks: torch.Tensor,
                block_ids: torch.Tensor, num_blocks: int, block_size: int, *,
                to_cache: bool = False) -> None:
    """Gathers blocks block_ids[i] of a paged cache into blocks[i] (to_cache=False), or
    scatters blocks[i] into them (to_cache=True), in one launch.

    kv_caches: the cache tensors (one per layer, or one cross-layer tensor; any layout
    kvpool.detect_layout knows); blocks: uint8 [n, bytes_per_block] in pinned host memory or on
    the GPU, each row the block's bytes in every segment in layout order (the pool's object
    format); block_ids: CPU int32/int64 [n].
    """
    _need_ops()
    _copy_check(list(kv_caches), blocks, block_ids, num_blocks, block_size)
    _copy_op(list(kv_caches), blocks, block_ids, int(num_blocks), int(block_size), bool(to_cache))
