"""The safetensors file format, for save/load_tensor_to/from_safetensor (no extra package).

A file is: an unsigned 64-bit little-endian header length N, N bytes of JSON
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the tensors' bytes (offsets relative to the end of the header), little-endian, row-major.
"""

import json
import struct

from kvpool._lazy_torch import LazyTable, torch

_CODES = [("F64", "float64"), ("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16"),
          ("I64", "int64"), ("I32", "int32"), ("I16", "int16"), ("I8", "int8"), ("U8", "uint8"),
          ("BOOL", "bool"), ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
          ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")]
TO_CODE = LazyTable(lambda: {getattr(torch, n): c for c, n in _CODES if hasattr(torch, n)})
FROM_CODE = LazyTable(lambda: {c: getattr(torch, n) for c, n in _CODES if hasattr(torch, n)})
_MAX_HEADER = 100 << 20


def save(tensors, path):
    """Writes {name: tensor} to path (tensors are copied to the CPU, contiguous)."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in TO_CODE:
            raise ValueError(f"{name}: dtype {tensor.dtype} has no safetensors code")
        t = tensor.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": TO_CODE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def load(path):
    """{name: tensor} from a safetensors file, in file order; ValueError if malformed."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > _MAX_HEADER or 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} is out of range")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{path}: header is not JSON: {e}") from None
    data = raw[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = FROM_CODE.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: {name}: unsupported dtype {entry.get('dtype')!r}")
        begin, end = entry["data_offsets"]
        shape = [int(d) for d in entry["shape"]]
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= len(data) or \
                end - begin != numel * torch.empty((), dtype=dtype).element_size():
            raise ValueError(f"{path}: {name}: data_offsets do not match its shape")
        chunk = bytearray(data[begin:end])
        t = torch.frombuffer(chunk, dtype=torch.uint8) if chunk else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(shape)
    return out
