"""Tensor objects as Mooncake Store lays them out: a 304-byte header, then the raw bytes.

The header (little-endian) is Mooncake's TensorMetadata, so tensors written through kvpool and
through Mooncake read back alike:

    offset  field
    0       u32 magic 0x4d4f4f4e, u16 version 1, u16 header_size 304
    8       i32 dtype (TensorDtype below), i32 ndim, u32 layout_kind (0 full, 1 shard), u32 flags
    24      u64 data_offset (304), u64 data_bytes
    40      i64 global_shape[8], i64 local_shape[8] (unused dims -1)
    168     u32 axis_count, u32 reserved, then 4 axes of {i32 kind, axis_index, shard_rank,
            shard_count, split_dim (-1: none), reserved0 (EP expert_id / PP stage_id);
            i64 reserved1 (the shard's extent along split_dim)}
"""

import struct

from kvpool._lazy_torch import LazyTable, torch

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
_HEAD = struct.Struct("<IHHiiIIQQ")  # 40 bytes
_SHAPE = struct.Struct("<8q")  # 64 bytes
_AXES = struct.Struct("<II")  # axis_count, reserved
_AXIS = struct.Struct("<iiiiiiq")  # 32 bytes
HEADER_SIZE = _HEAD.size + 2 * _SHAPE.size + _AXES.size + MAX_AXES * _AXIS.size  # 304

# Mooncake's TensorDtype numbering.
_DTYPES = [
    (0, "float32"), (1, "float64"), (2, "int8"), (3, "uint8"), (4, "int16"), (5, "uint16"),
    (6, "int32"), (7, "uint32"), (8, "int64"), (9, "uint64"), (10, "bool"), (11, "float16"),
    (12, "bfloat16"), (13, "float8_e4m3fn"), (14, "float8_e5m2"),
]
DTYPE_TO_CODE = LazyTable(lambda: {getattr(torch, n): c for c, n in _DTYPES
                                     if getattr(torch, n, None) is not None})
CODE_TO_DTYPE = LazyTable(lambda: {c: getattr(torch, n) for c, n in _DTYPES
                                   if getattr(torch, n, None) is not None})

# Axis kinds of a shard's layout.
AXIS_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}


class TensorFormatError(ValueError):
    """The bytes are not a tensor object (bad magic, version, dtype or sizes)."""


def header(dtype_code, global_shape, local_shape, data_bytes, axes=()):
    """The 304-byte header; `axes` are (kind, index, rank, count, split_dim[, reserved0,
    reserved1]) tuples (reserved fields default to 0)."""
    if len(global_shape) > MAX_DIMS:
        raise TensorFormatError(f"a tensor object holds at most {MAX_DIMS} dimensions")
    layout_kind = 1 if axes else 0
    head = _HEAD.pack(MAGIC, VERSION, HEADER_SIZE, dtype_code, len(global_shape), layout_kind, 0,
                      HEADER_SIZE, data_bytes)

    def shape(dims):
        return _SHAPE.pack(*(list(dims) + [-1] * (MAX_DIMS - len(dims))))

    axes = list(axes)[:MAX_AXES]
    packed_axes = b"".join(_AXIS.pack(*(tuple(a) + (0, 0))[:7]) for a in axes)
    packed_axes += bytes(_AXIS.size * (MAX_AXES - len(axes)))
    return head + shape(global_shape) + shape(local_shape) + _AXES.pack(len(axes), 0) + packed_axes


class Parsed:
    """A parsed header: dtype, local shape, where the data starts and how long it is; `axes`
    are (kind, index, rank, count, split_dim, reserved0, reserved1) tuples, `layout_kind` 0
    for a whole tensor, 1 for a shard."""

    __slots__ = ("dtype", "shape", "global_shape", "data_offset", "data_bytes", "axes",
                 "layout_kind", "dtype_code")

    def __init__(self, dtype, shape, global_shape, data_offset, data_bytes, axes,
                 layout_kind=0, dtype_code=0):
        self.dtype = dtype
        self.shape = shape
        self.global_shape = global_shape
        self.data_offset = data_offset
        self.data_bytes = data_bytes
        self.axes = axes
        self.layout_kind = layout_kind
        self.dtype_code = dtype_code


def parse(buf, total=None):
    """Parses the header at the start of `buf` (bytes-like of at least HEADER_SIZE bytes)."""
    view = memoryview(buf).cast("B")
    total = len(view) if total is None else total
    if total < HEADER_SIZE or len(view) < HEADER_SIZE:
        raise TensorFormatError(f"{total} bytes are too few for a tensor object")
    magic, version, header_size, dtype_code, ndim, kind, _flags, data_offset, data_bytes = (
        _HEAD.unpack_from(view, 0))
    if magic != MAGIC or version != VERSION:
        raise TensorFormatError("not a tensor object (bad magic or version)")
    if dtype_code not in CODE_TO_DTYPE:
        raise TensorFormatError(f"unknown tensor dtype code {dtype_code}")
    if not 0 <= ndim <= MAX_DIMS or data_offset < header_size:
        raise TensorFormatError("corrupt tensor header")
    global_shape = list(_SHAPE.unpack_from(view, _HEAD.size))[:ndim]
    local_shape = list(_SHAPE.unpack_from(view, _HEAD.size + _SHAPE.size))[:ndim]
    count, _ = _AXES.unpack_from(view, _HEAD.size + 2 * _SHAPE.size)
    axes = []
    base = _HEAD.size + 2 * _SHAPE.size + _AXES.size
    for i in range(min(count, MAX_AXES)):
        axes.append(_AXIS.unpack_from(view, base + i * _AXIS.size))
    dtype = CODE_TO_DTYPE[dtype_code]
    numel = 1
    for d in local_shape:
        if d < 0:
            raise TensorFormatError("corrupt tensor shape")
        numel *= d
    expected = numel * torch.empty((), dtype=dtype).element_size()
    if data_bytes == 0 and expected != 0:
        data_bytes = expected
    if data_bytes != expected or data_offset + data_bytes > total:
        raise TensorFormatError(
            f"tensor header promises {expected} data bytes at {data_offset}, object has {total}")
    return Parsed(dtype, local_shape, global_shape, data_offset, data_bytes, axes, kind,
                  dtype_code)


def check_tensor(tensor):
    """The tensor as a contiguous CPU tensor; TypeError/ValueError for what cannot be stored."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPE_TO_CODE:
        raise ValueError(f"tensor dtype {tensor.dtype} cannot be stored")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"a stored tensor has at most {MAX_DIMS} dimensions")
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    return tensor.contiguous()


def data_view(tensor):
    """The bytes of a contiguous CPU tensor, without a copy (a uint8 numpy view)."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy() if tensor.dtype != torch.uint8 else flat.numpy()


def serialize(tensor, global_shape=None, axes=()):
    """(header, data) for a contiguous CPU tensor: two parts of one object."""
    local = list(tensor.shape)
    nbytes = tensor.numel() * tensor.element_size()
    head = header(DTYPE_TO_CODE[tensor.dtype], list(global_shape or local), local, nbytes, axes)
    return head, data_view(tensor)


def tensor_from(buf, parsed):
    """A tensor over `buf`'s data (no copy: it shares buf's memory)."""
    if parsed.data_bytes == 0:
        return torch.empty(parsed.shape, dtype=parsed.dtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=parsed.data_bytes,
                           offset=parsed.data_offset)
    return raw.view(parsed.dtype).reshape(parsed.shape)


class _DeviceBytes:
    """`nbytes` bytes of CUDA device memory at `ptr`, seen by torch through the CUDA array
    interface (the memory stays the caller's; the tensor only points at it)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
            "strides": None}


def device_tensor_from(ptr, parsed):
    """A CUDA tensor over the data of the tensor object at device address `ptr` (no copy)."""
    if parsed.data_bytes == 0:
        return torch.empty(parsed.shape, dtype=parsed.dtype, device="cuda")
    raw = torch.as_tensor(_DeviceBytes(ptr + parsed.data_offset, parsed.data_bytes),
                          device="cuda")
    return raw.view(parsed.dtype).reshape(parsed.shape)
