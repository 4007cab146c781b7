"""Mooncake's unified parallelism tensor API over kvpool's tensor objects.

`ParallelAxis`, `TensorParallelism`, `ReadTarget` and the `*_tensor_with_parallelism*` calls of
`mooncake.store.MooncakeDistributedStore` (Mooncake's store_py_parallel_{write,read}.h), with the
same keys, object layouts and answers, so shards written by either read back through the other:

Writes (`put_tensor_with_parallelism(key, tensor, parallelism=None, config=None,
writer_partition=None)`, its batch, `_from` and upsert forms):

- neither: the whole tensor under `key` (put_tensor);
- `writer_partition` (any object with rank, size, split_dim): `tensor` is the whole tensor;
  its shard `rank` of `size` along split_dim is stored under `key__writer_<r>of<s>_sd<d>`,
  and a manifest (global shape, dtype, split_dim, shard count) under `key__writer_manifest`;
- a `TensorParallelism` with only a TP axis: `tensor` is this rank's shard, stored under
  `key_tp_<rank>` (the `_with_tp` calls' keys) with the whole shape inferred (shard extent x
  size), and a manifest under `key__parallelism_manifest`;
- several axes, one of them TP: `tensor` is the whole tensor; the TP rank's shard is stored
  under `key__dp_<r>of<s>__tp_<r>of<s>_sd<d>__ep_..._eid<e>__pp_..._sid<s>` (axes in the
  order dp, tp, ep, pp), plus the manifest;
- axes without TP (DP, EP with expert_id, PP with stage_id): `tensor` as given, under the
  same kind of name, no manifest.
- the `_from` forms take a serialized tensor object (header + data) from a buffer; with a TP
  axis they store every TP rank's shard of it (as Mooncake's do), without a manifest.

Only uniform splits are accepted (the dimension divides by the shard count); DP and PP axes
take no split_dim, EP needs expert_id, PP stage_id, TP split_dim; anything else is -600.

Reads (`get_tensor_with_parallelism(key, target=None)`, batch and `_into` forms), by
`ReadTarget.mode`:

- `as_stored` (the default): the object under `key`;
- `shard` with a parallelism: the object stored for exactly that parallelism (its header must
  say so), else the writer partition shard of the same rank/size/split (single TP axis), else
  the requested TP shard cut out of the shards stored for another TP size (resharding), else,
  for a single TP axis, whatever `key_tp_<rank>` holds;
- `full` without a parallelism: the whole tensor reassembled from the writer partition shards
  its manifest names;
- `full` with a parallelism (it needs a TP axis): the whole tensor reassembled from the TP
  shards (the count from the parallelism manifest if there is one, else from the shards).

A read that finds nothing consistent answers None (logged); `_into` forms write the header and
data into a registered buffer and return a tensor over it (None if it does not fit).
"""

import copy
import ctypes
import logging
import struct

from kvpool import _kvpool
from kvpool import _tensor
from kvpool._lazy_torch import torch

_log = logging.getLogger("kvpool.store")

INVALID_PARAMS = _kvpool.INVALID_PARAMS
OK = 0

_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}  # also the canonical key order
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_MODES = ("as_stored", "shard", "full")

# The manifest of a sharded tensor (Mooncake's WriterShardManifest, 96 bytes little-endian):
# u32 magic, u16 version, u16 header_size, i32 dtype, ndim, split_dim, shard_count, reserved,
# 4 bytes of padding, i64 global_shape[8].
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
_MANIFEST_MAGIC = 0x574D414E
_MANIFEST_VERSION = 1


class ParallelAxis:
    """One axis of a tensor's parallel layout: kind ("tp", "dp", "ep", "pp"), rank, size,
    split_dim (TP only), expert_id (EP), stage_id (PP)."""

    __slots__ = ("kind", "rank", "size", "split_dim", "expert_id", "stage_id")

    def __init__(self):
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim = None
        self.expert_id = None
        self.stage_id = None

    def __repr__(self):
        return (f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, "
                f"split_dim={self.split_dim}, expert_id={self.expert_id}, "
                f"stage_id={self.stage_id})")


class TensorParallelism:
    """A tensor's parallel layout: `axes`, a list of ParallelAxis (copied when assigned, as
    Mooncake's binding does; the list read back holds the stored axes)."""

    __slots__ = ("_axes",)

    def __init__(self):
        self._axes = []

    @property
    def axes(self):
        return list(self._axes)

    @axes.setter
    def axes(self, value):
        self._axes = [copy.copy(a) for a in value]

    def __repr__(self):
        return f"TensorParallelism(axes={self._axes!r})"


class ReadTarget:
    """What a read returns: mode "as_stored" (default), "shard" or "full", and the reader's
    parallelism (a TensorParallelism, or None)."""

    __slots__ = ("_mode", "_parallelism")

    def __init__(self):
        self._mode = "as_stored"
        self._parallelism = None

    @property
    def mode(self):
        return self._mode

    @mode.setter
    def mode(self, value):
        mode = str(value).lower()
        if mode not in _MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = mode

    @property
    def parallelism(self):
        return self._parallelism

    @parallelism.setter
    def parallelism(self, value):
        if value is None:
            self._parallelism = None
            return
        cloned = TensorParallelism()
        cloned.axes = value.axes
        self._parallelism = cloned

    def __repr__(self):
        return f"ReadTarget(mode={self._mode!r}, parallelism={self._parallelism!r})"


class _Invalid(ValueError):
    """A parallelism, writer partition or target that Mooncake refuses (INVALID_PARAMS)."""


class _Axis:
    """An axis as a value: kind (lower-case), rank, size, split_dim, expert_id, stage_id."""

    __slots__ = ("kind", "rank", "size", "split_dim", "expert_id", "stage_id")

    def __init__(self, kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def with_rank(self, rank, size=None):
        return _Axis(self.kind, rank, self.size if size is None else size, self.split_dim,
                     self.expert_id, self.stage_id)

    def as_tuple(self):
        return (self.kind, self.rank, self.size, self.split_dim, self.expert_id, self.stage_id)

    def __eq__(self, other):
        return isinstance(other, _Axis) and self.as_tuple() == other.as_tuple()

    def __hash__(self):
        return hash(self.as_tuple())


def _opt_int(value, what):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or None")
    return value


def _parse_axes(parallelism):
    """The axes of a TensorParallelism-like object (anything with .axes of axis-like objects)."""
    if not hasattr(parallelism, "axes"):
        raise _Invalid("TensorParallelism must provide axes")
    axes = []
    for a in parallelism.axes:
        if not all(hasattr(a, f) for f in ("kind", "rank", "size")):
            raise _Invalid("ParallelAxis must provide kind, rank, and size")
        kind = str(a.kind).lower()
        if kind not in _KINDS:
            raise _Invalid(f"unsupported parallel axis kind {a.kind!r}")
        axes.append(_Axis(kind, int(a.rank), int(a.size),
                          _opt_int(getattr(a, "split_dim", None), "split_dim"),
                          _opt_int(getattr(a, "expert_id", None), "expert_id"),
                          _opt_int(getattr(a, "stage_id", None), "stage_id")))
    return axes


def _validate(axes):
    """Mooncake's validate_parallelism_spec: raises _Invalid with the reason."""
    if not axes:
        raise _Invalid("parallelism axes cannot be empty")
    if len(axes) > _tensor.MAX_AXES:
        raise _Invalid("axis count exceeds max supported axes")
    seen = set()
    for a in axes:
        if a.size <= 0 or a.rank < 0 or a.rank >= a.size:
            raise _Invalid(f"invalid rank/size for axis {a.kind}")
        if a.kind in seen:
            raise _Invalid("duplicate axis kinds are not supported")
        seen.add(a.kind)
        if a.kind == "tp" and a.split_dim is None:
            raise _Invalid("TP axis requires split_dim")
        if a.kind == "dp" and a.split_dim is not None:
            raise _Invalid("DP axis must not provide split_dim")
        if a.kind == "ep" and (a.expert_id is None or a.split_dim is not None):
            raise _Invalid("EP axis requires expert_id and takes no split_dim")
        if a.kind == "pp" and (a.stage_id is None or a.split_dim is not None):
            raise _Invalid("PP axis requires stage_id and takes no split_dim")
    return axes


def parse_parallelism(parallelism):
    """Validated axes of a parallelism (in the caller's order); _Invalid if refused."""
    if parallelism is None:
        raise _Invalid("parallelism is required")
    return _validate(_parse_axes(parallelism))


def _canonical(axes):
    return sorted(axes, key=lambda a: _KINDS[a.kind])


def _tp_index(axes):
    return next((i for i, a in enumerate(axes) if a.kind == "tp"), None)


def _single_tp(axes):
    return len(axes) == 1 and axes[0].kind == "tp"


def _axis_suffix(a):
    suffix = f"{a.kind}_{a.rank}of{a.size}"
    if a.split_dim is not None:
        suffix += f"_sd{a.split_dim}"
    if a.expert_id is not None:
        suffix += f"_eid{a.expert_id}"
    if a.stage_id is not None:
        suffix += f"_sid{a.stage_id}"
    return suffix


def shard_key(base_key, axes):
    """Where the shard of `axes` lives: key_tp_<rank> for a single TP axis, else
    key__<axis>__<axis>... in the order dp, tp, ep, pp."""
    if _single_tp(axes):
        return f"{base_key}_tp_{axes[0].rank}"
    return base_key + "".join("__" + _axis_suffix(a) for a in _canonical(axes))


def writer_shard_key(base_key, rank, size, split_dim):
    return f"{base_key}__writer_{rank}of{size}_sd{split_dim}"


def writer_manifest_key(base_key):
    return base_key + "__writer_manifest"


def parallelism_manifest_key(base_key):
    return base_key + "__parallelism_manifest"


def pack_manifest(global_shape, dtype_code, split_dim, shard_count):
    dims = list(global_shape) + [-1] * (_tensor.MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(_MANIFEST_MAGIC, _MANIFEST_VERSION, _MANIFEST.size, dtype_code,
                          len(global_shape), split_dim, shard_count, 0, *dims)


def parse_manifest(value):
    """(global_shape, dtype_code, split_dim, shard_count) of a manifest, or None."""
    if not isinstance(value, (bytes, bytearray)) or len(value) < _MANIFEST.size:
        return None
    magic, version, size, dtype, ndim, split_dim, count, _, *dims = _MANIFEST.unpack_from(value)
    if (magic != _MANIFEST_MAGIC or version != _MANIFEST_VERSION or size != _MANIFEST.size
            or not 0 <= ndim <= _tensor.MAX_DIMS or count <= 0 or not 0 <= split_dim < ndim):
        return None
    shape = dims[:ndim]
    if any(d < 0 for d in shape):
        return None
    return shape, dtype, split_dim, count


def _layout_axes(axes, local_shape):
    """Header axes for `axes` (caller's order) of a shard of local_shape."""
    out = []
    for i, a in enumerate(axes):
        if a.split_dim is not None and not 0 <= a.split_dim < len(local_shape):
            raise _Invalid(f"split_dim {a.split_dim} out of range for a "
                           f"{len(local_shape)}-d tensor")
        reserved0 = (a.expert_id if a.kind == "ep" else a.stage_id if a.kind == "pp" else
                     None) or 0
        extent = local_shape[a.split_dim] if a.split_dim is not None else 0
        out.append((_KINDS[a.kind], i, a.rank, a.size,
                    -1 if a.split_dim is None else a.split_dim, reserved0, extent))
    return out


def stored_axes(parsed):
    """The canonical axes a shard object's header records, or None for a whole tensor."""
    if parsed.layout_kind != 1:
        return None
    axes = []
    for kind, _, rank, count, split_dim, reserved0, _ in parsed.axes:
        name = _KIND_NAMES.get(kind)
        if name is None:
            return None
        axes.append(_Axis(name, rank, count, split_dim if split_dim >= 0 else None,
                          reserved0 if name == "ep" else None,
                          reserved0 if name == "pp" else None))
    return _canonical(axes)


def _matches(axes, parsed):
    stored = stored_axes(parsed)
    return stored is not None and stored == _canonical(axes)


def _tp_compatible(axes, parsed):
    """Mooncake's resolve_tp_compatible_parallelism_from_metadata + equal-by-kind with the TP
    rank free: the stored shard has the same axes as `axes` but for the TP rank."""
    stored = stored_axes(parsed)
    wanted = _canonical(axes)
    if stored is None or len(stored) != len(wanted):
        return False
    for s, w in zip(stored, wanted):
        if s.kind != w.kind:
            return False
        if w.kind == "tp":
            if (s.size, s.split_dim, s.expert_id, s.stage_id) != \
                    (w.size, w.split_dim, w.expert_id, w.stage_id):
                return False
        elif s != w:
            return False
    return True


def shard_range(dim, rank, count):
    """[start, start + extent) of shard rank of count along a dimension of size dim."""
    start = dim * rank // count
    return start, dim * (rank + 1) // count - start


def _uniform(shape, split_dim, count):
    return 0 <= split_dim < len(shape) and count > 0 and shape[split_dim] % count == 0


def _tp_axis_of(parsed):
    return next((a for a in parsed.axes if a[0] == _KINDS["tp"]), None)


class _Source:
    """A stored tensor object: its key, its bytes, parsed header and the tensor over them."""

    __slots__ = ("key", "raw", "parsed", "tensor")

    def __init__(self, key, raw, parsed, tensor):
        self.key, self.raw, self.parsed, self.tensor = key, raw, parsed, tensor


class _Reconstruction:
    __slots__ = ("sources", "global_shape", "split_dim", "dtype_code")

    def __init__(self, sources, global_shape, split_dim, dtype_code):
        self.sources, self.global_shape = sources, list(global_shape)
        self.split_dim, self.dtype_code = split_dim, dtype_code


class ParallelismMixin:
    """The *_tensor_with_parallelism* calls of MooncakeDistributedStore (see the module
    docstring). Needs the store's _require, _put_tensors, _replace, _put_ptrs and
    _kvpool.Store's value reads."""

    # --- reading objects ------------------------------------------------------------------

    def _load_objects(self, keys):
        """Per key a _Source (a tensor object that parses), or None."""
        values = _kvpool.Store._get_values(self, list(keys)) if keys else []
        out = []
        for key, value in zip(keys, values):
            if not isinstance(value, bytes):
                out.append(None)
                continue
            buf = bytearray(value)
            try:
                parsed = _tensor.parse(buf)
            except _tensor.TensorFormatError:
                out.append(None)
                continue
            out.append(_Source(key, buf, parsed, _tensor.tensor_from(buf, parsed)))
        return out

    def _load_all(self, keys):
        """Every key's _Source, or None if any is missing (Mooncake reads them as one batch)."""
        sources = self._load_objects(keys)
        return None if any(s is None for s in sources) else sources

    def _load_value(self, key):
        value = _kvpool.Store._get_values(self, [key])[0]
        return value if isinstance(value, bytes) else None

    # --- reconstruction -------------------------------------------------------------------

    def _manifest_sources(self, key, axes):
        tp = next(a for a in axes if a.kind == "tp")
        manifest = parse_manifest(self._load_value(parallelism_manifest_key(key)))
        if manifest is None:
            return None
        shape, dtype, split_dim, count = manifest
        if tp.split_dim != split_dim or not _uniform(shape, split_dim, tp.size) or \
                not _uniform(shape, split_dim, count):
            return None
        canonical = _canonical(axes)
        ti = _tp_index(canonical)
        ranks = []
        for r in range(count):
            c = list(canonical)
            c[ti] = c[ti].with_rank(r, count)
            ranks.append(c)
        sources = self._load_all([shard_key(key, c) for c in ranks])
        if sources is None:
            return None
        for c, s in zip(ranks, sources):
            if not _tp_compatible(c, s.parsed):
                return None
        return _Reconstruction(sources, shape, split_dim, dtype)

    def _full_sources(self, key, axes):
        """The shards to reassemble `key`'s whole tensor from, for a reader with `axes` (which
        has a TP axis), or None (logged)."""
        found = self._manifest_sources(key, axes)
        if found is not None:
            return found
        tp = next(a for a in axes if a.kind == "tp")
        canonical = _canonical(axes)
        if _single_tp(canonical):
            first = self._load_objects([key if tp.size <= 1 else f"{key}_tp_0"])[0]
            stored_tp = _tp_axis_of(first.parsed) if first is not None else None
            if first is None or first.parsed.layout_kind != 1 or stored_tp is None:
                _log.error("get_tensor_with_parallelism(%s): no TP shard 0", key)
                return None
            split_dim, count = stored_tp[4], stored_tp[3]
            shape = first.parsed.global_shape
            if split_dim != tp.split_dim or not _uniform(shape, split_dim, tp.size) or \
                    not _uniform(shape, split_dim, count):
                _log.error("get_tensor_with_parallelism(%s): split_dim or size mismatch", key)
                return None
            keys = [key if count <= 1 else f"{key}_tp_{r}" for r in range(count)]
            sources = self._load_all(keys)
            if sources is None:
                _log.error("get_tensor_with_parallelism(%s): a TP shard is missing", key)
                return None
            for r, s in enumerate(sources):
                a = _tp_axis_of(s.parsed)
                if s.parsed.layout_kind != 1 or a is None or a[2] != r or a[3] != count or \
                        a[4] != split_dim:
                    _log.error("get_tensor_with_parallelism(%s): shard %d does not match", key,
                               r)
                    return None
            return _Reconstruction(sources, shape, split_dim, first.parsed.dtype_code)
        ti = _tp_index(canonical)
        ranks = []
        for r in range(tp.size):
            c = list(canonical)
            c[ti] = c[ti].with_rank(r)
            ranks.append(c)
        sources = self._load_all([shard_key(key, c) for c in ranks])
        if sources is None:
            _log.error("get_tensor_with_parallelism(%s): a shard is missing", key)
            return None
        for c, s in zip(ranks, sources):
            if not _tp_compatible(c, s.parsed):
                _log.error("get_tensor_with_parallelism(%s): shard %s does not match", key,
                           s.key)
                return None
        first = sources[0].parsed
        shape, split_dim = first.global_shape, _tp_axis_of(first)[4]
        if split_dim != tp.split_dim or not _uniform(shape, split_dim, tp.size):
            return None
        return _Reconstruction(sources, shape, split_dim, first.dtype_code)

    def _writer_sources(self, key):
        manifest = parse_manifest(self._load_value(writer_manifest_key(key)))
        if manifest is None:
            return None
        shape, dtype, split_dim, count = manifest
        sources = self._load_all([writer_shard_key(key, r, count, split_dim)
                                  for r in range(count)])
        if sources is None:
            _log.error("get_tensor_with_parallelism(%s): a writer shard is missing", key)
            return None
        for r, s in enumerate(sources):
            stored = stored_axes(s.parsed)
            if stored is None or not _single_tp(stored) or \
                    (stored[0].rank, stored[0].size, stored[0].split_dim) != \
                    (r, count, split_dim):
                _log.error("get_tensor_with_parallelism(%s): writer shard %d does not match",
                           key, r)
                return None
        return _Reconstruction(sources, shape, split_dim, dtype)

    @staticmethod
    def _assemble(rec, start, extent):
        """Rows [start, start + extent) along rec.split_dim of the whole tensor, from its
        shards; None if they do not cover them or do not fit together."""
        shape, split = rec.global_shape, rec.split_dim
        dtype = _tensor.CODE_TO_DTYPE.get(rec.dtype_code)
        if dtype is None or not 0 <= start <= start + extent <= shape[split]:
            return None
        target_shape = list(shape)
        target_shape[split] = extent
        out = torch.empty(target_shape, dtype=dtype)
        covered = [False] * extent
        for s in rec.sources:
            p = s.parsed
            tp = _tp_axis_of(p)
            if s.tensor.dtype != dtype or p.layout_kind != 1 or tp is None or tp[4] != split \
                    or not 0 <= tp[2] < tp[3] or not _uniform(shape, split, tp[3]):
                return None
            if any(d != g for i, (d, g) in enumerate(zip(p.shape, shape)) if i != split) or \
                    len(p.shape) != len(shape):
                return None
            s_start, s_extent = shard_range(shape[split], tp[2], tp[3])
            if p.shape[split] != s_extent:
                return None
            lo, hi = max(s_start, start), min(s_start + s_extent, start + extent)
            if hi <= lo:
                continue
            out.narrow(split, lo - start, hi - lo).copy_(s.tensor.narrow(split, lo - s_start,
                                                                         hi - lo))
            covered[lo - start:hi - start] = [True] * (hi - lo)
        return out if all(covered) else None

    def _reconstruct_full(self, rec):
        """(tensor, header) of the whole tensor, or None."""
        if rec is None:
            return None
        t = self._assemble(rec, 0, rec.global_shape[rec.split_dim])
        if t is None:
            return None
        head = _tensor.header(rec.dtype_code, rec.global_shape, rec.global_shape,
                              t.numel() * t.element_size())
        return t, head

    def _reconstruct_shard(self, key, axes):
        """(tensor, header) of the TP shard `axes` asks for, cut from the stored shards."""
        rec = self._full_sources(key, axes)
        if rec is None:
            return None
        tp = next(a for a in axes if a.kind == "tp")
        start, extent = shard_range(rec.global_shape[rec.split_dim], tp.rank, tp.size)
        t = self._assemble(rec, start, extent)
        if t is None:
            return None
        head = _tensor.header(rec.dtype_code, rec.global_shape, list(t.shape),
                              t.numel() * t.element_size(), _layout_axes(axes, list(t.shape)))
        return t, head

    # --- reading by target ----------------------------------------------------------------

    def _read_target(self, method, key, target):
        """(tensor, header or None) the target asks for: header None when the tensor is a
        stored object as it is (copied with its own header). None if nothing matches."""
        mode = "as_stored" if target is None else str(target.mode).lower()
        parallelism = None if target is None else target.parallelism
        if mode not in _MODES:
            _log.error("%s: unsupported ReadTarget mode %r", method, mode)
            return None
        if parallelism is None:
            if mode == "as_stored":
                src = self._load_objects([key])[0]
                return None if src is None else (src, None)
            if mode == "full":
                return self._reconstruct_full(self._writer_sources(key))
            _log.error("%s: a shard read needs a parallelism", method)
            return None
        try:
            axes = parse_parallelism(parallelism)
        except (_Invalid, TypeError, ValueError) as e:
            _log.error("%s: %s", method, e)
            return None
        has_tp = _tp_index(axes) is not None
        if mode == "shard":
            src = self._load_objects([shard_key(key, axes)])[0]
            if src is not None and _matches(axes, src.parsed):
                return src, None
            if _single_tp(axes):
                a = axes[0]
                src = self._load_objects([writer_shard_key(key, a.rank, a.size,
                                                           a.split_dim or 0)])[0]
                if src is not None and _matches(axes, src.parsed):
                    return src, None
            if has_tp:
                got = self._reconstruct_shard(key, axes)
                if got is not None:
                    return got
            if _single_tp(axes):
                a = axes[0]
                src = self._load_objects([key if a.size <= 1 else f"{key}_tp_{a.rank}"])[0]
                if src is not None:
                    return src, None
            _log.error("%s: no shard of %s matches the requested parallelism", method, key)
            return None
        if mode == "full":
            if not has_tp:
                _log.error("%s: full reconstruction requires a TP axis", method)
                return None
            return self._reconstruct_full(self._full_sources(key, axes))
        _log.error("%s: mode as_stored takes no parallelism", method)
        return None

    def get_tensor_with_parallelism(self, key, target=None):
        """The tensor `target` asks for (see the module docstring), or None."""
        self._require("get_tensor_with_parallelism")
        got = self._read_target("get_tensor_with_parallelism", key, target)
        if got is None:
            return None
        value, _ = got
        return value.tensor if isinstance(value, _Source) else value

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        self._require("batch_get_tensor_with_parallelism")
        keys = list(keys)
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            _log.error("batch_get_tensor_with_parallelism: targets must be a list as long as "
                       "keys")
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def _registered_room(self, ptr):
        """Bytes from ptr to the end of the registered buffer holding it, or None."""
        for base, n in _kvpool.Store.registered_buffers(self):
            if base <= ptr < base + n:
                return base + n - ptr
        return None

    def _read_into(self, method, key, buffer_ptr, size, target):
        got = self._read_target(method, key, target)
        if got is None:
            return None
        value, head = got
        if isinstance(value, _Source):
            # A stored object is copied as it is, header and all.
            p = value.parsed
            payload = bytes(value.raw[:p.data_offset + p.data_bytes])
        else:
            t = value.contiguous()
            payload = head + (bytes(_tensor.data_view(t)) if t.numel() else b"")
        total = len(payload)
        room = self._registered_room(buffer_ptr)
        if room is None:
            _log.error("%s: buffer %#x is not registered (register_buffer)", method, buffer_ptr)
            return None
        if total > size or total > room:
            _log.error("%s: %d bytes do not fit the %d-byte buffer", method, total, size)
            return None
        ctypes.memmove(buffer_ptr, payload, total)
        buf = (ctypes.c_char * total).from_address(buffer_ptr)
        return _tensor.tensor_from(buf, _tensor.parse(buf, total))

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        """As get_tensor_with_parallelism, written (header + data) into a registered buffer;
        a tensor over the buffer's data, or None."""
        self._require("get_tensor_with_parallelism_into")
        return self._read_into("get_tensor_with_parallelism_into", key, buffer_ptr, size, target)

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        self._require("batch_get_tensor_with_parallelism_into")
        keys = list(keys)
        if not len(keys) == len(buffer_ptrs) == len(sizes) or \
                (targets is not None and (not isinstance(targets, list) or
                                          len(targets) != len(keys))):
            _log.error("batch_get_tensor_with_parallelism_into: keys, buffer_ptrs, sizes and "
                       "targets must line up")
            return [None] * len(keys)
        targets = targets if targets is not None else [None] * len(keys)
        return [self._read_into("batch_get_tensor_with_parallelism_into", k, p, s, t)
                for k, p, s, t in zip(keys, buffer_ptrs, sizes, targets)]

    # --- writing --------------------------------------------------------------------------

    def _put_object(self, method, key, tensor, config, upsert, global_shape=None, axes=()):
        return self._put_tensors(method, [key], [tensor], config, upsert,
                                 shard=(global_shape or list(tensor.shape), axes))[0]

    def _put_manifest(self, method, key, data, config, upsert):
        buf = ctypes.create_string_buffer(data, len(data))
        if upsert:
            self._replace([key])
        return self._put_ptrs(method, [key], [[ctypes.addressof(buf)]], [[len(data)]],
                              config)[0]

    @staticmethod
    def _writer_of(writer_partition):
        if not all(hasattr(writer_partition, f) for f in ("rank", "size", "split_dim")):
            raise _Invalid("writer_partition must provide rank, size, and split_dim")
        rank, size = int(writer_partition.rank), int(writer_partition.size)
        split_dim = int(writer_partition.split_dim)
        if size <= 0 or rank < 0 or rank >= size or split_dim < 0:
            raise _Invalid("invalid writer partition")
        return rank, size, split_dim

    def _write_tensor(self, method, key, tensor, parallelism, config, writer_partition,
                      upsert):
        """One tensor by its route (module docstring): 0 or a negative code."""
        if parallelism is not None and writer_partition is not None:
            _log.error("%s: writer_partition cannot be combined with parallelism", method)
            return INVALID_PARAMS
        if writer_partition is None and parallelism is None:
            return self._put_tensors(method, [key], [tensor], config, upsert)[0]
        try:
            t = _tensor.check_tensor(tensor)
            code = _tensor.DTYPE_TO_CODE[t.dtype]
            shape = list(t.shape)
            if writer_partition is not None:
                rank, size, split_dim = self._writer_of(writer_partition)
                if not _uniform(shape, split_dim, size):
                    raise _Invalid(f"dimension {split_dim} of {shape} does not split {size} "
                                   "ways evenly")
                start, extent = shard_range(shape[split_dim], rank, size)
                shard = t.narrow(split_dim, start, extent).contiguous()
                axes = _layout_axes([_Axis("tp", rank, size, split_dim)], list(shard.shape))
                rc = self._put_object(method, writer_shard_key(key, rank, size, split_dim),
                                      shard, config, upsert, shape, axes)
                if rc != OK:
                    return rc
                return self._put_manifest(method, writer_manifest_key(key),
                                          pack_manifest(shape, code, split_dim, size), config,
                                          upsert)
            axes = parse_parallelism(parallelism)
            ti = _tp_index(axes)
            if ti is None:
                return self._put_object(method, shard_key(key, axes), t, config, upsert, shape,
                                        _layout_axes(axes, shape))
            tp = axes[ti]
            if not 0 <= tp.split_dim < len(shape):
                raise _Invalid(f"split_dim {tp.split_dim} out of range")
            if len(axes) == 1:
                # The tensor is this rank's shard; the whole shape follows from the size.
                shard, full = t, list(shape)
                full[tp.split_dim] *= tp.size
            else:
                if not _uniform(shape, tp.split_dim, tp.size):
                    raise _Invalid(f"dimension {tp.split_dim} of {shape} does not split "
                                   f"{tp.size} ways evenly")
                start, extent = shard_range(shape[tp.split_dim], tp.rank, tp.size)
                shard, full = t.narrow(tp.split_dim, start, extent).contiguous(), shape
            rc = self._put_object(method, shard_key(key, axes), shard, config, upsert, full,
                                  _layout_axes(axes, list(shard.shape)))
            if rc != OK:
                return rc
            return self._put_manifest(method, parallelism_manifest_key(key),
                                      pack_manifest(full, code, tp.split_dim, tp.size), config,
                                      upsert)
        except (_Invalid, TypeError, ValueError) as e:
            _log.error("%s(%s): %s", method, key, e)
            return INVALID_PARAMS

    def _tensor_of_buffer(self, method, buffer_ptr, size):
        """(tensor, parsed) of the tensor object in a buffer; _Invalid if it is none."""
        if not buffer_ptr or size < _tensor.HEADER_SIZE:
            raise _Invalid(f"{size} bytes at {buffer_ptr:#x} cannot hold a tensor object")
        buf = (ctypes.c_char * size).from_address(buffer_ptr)
        try:
            parsed = _tensor.parse(buf, size)
        except _tensor.TensorFormatError as e:
            raise _Invalid(str(e)) from e
        return _tensor.tensor_from(buf, parsed), parsed

    def _write_from(self, method, key, buffer_ptr, size, parallelism, config, writer_partition,
                    upsert):
        if parallelism is not None and writer_partition is not None:
            _log.error("%s: writer_partition cannot be combined with parallelism", method)
            return INVALID_PARAMS
        if parallelism is None and writer_partition is None:
            return (self.upsert_tensor_from if upsert else self.put_tensor_from)(
                key, buffer_ptr, size, config)
        try:
            tensor, parsed = self._tensor_of_buffer(method, buffer_ptr, size)
            if writer_partition is not None:
                if parsed.global_shape != parsed.shape:
                    raise _Invalid("a writer partition is cut from a whole tensor object")
                return self._write_tensor(method, key, tensor, None, config, writer_partition,
                                          upsert)
            axes = parse_parallelism(parallelism)
            ti = _tp_index(axes)
            if ti is None:
                return self._put_object(method, shard_key(key, axes), tensor, config, upsert,
                                        parsed.global_shape, _layout_axes(axes, parsed.shape))
            # Every TP rank's shard of the whole tensor in the buffer (no manifest, as Mooncake).
            tp = axes[ti]
            shape = parsed.global_shape
            if parsed.shape != shape and any(
                    d != g for i, (d, g) in enumerate(zip(parsed.shape, shape))
                    if i != tp.split_dim):
                raise _Invalid("unsupported non-split local shape")
            if not _uniform(shape, tp.split_dim, tp.size):
                raise _Invalid(f"dimension {tp.split_dim} of {shape} does not split {tp.size} "
                               "ways evenly")
            for rank in range(tp.size):
                start, extent = shard_range(shape[tp.split_dim], rank, tp.size)
                shard = tensor.narrow(tp.split_dim, start, extent).contiguous()
                rank_axes = list(axes)
                rank_axes[ti] = tp.with_rank(rank)
                rc = self._put_object(method, shard_key(key, rank_axes), shard, config, upsert,
                                      shape, _layout_axes(rank_axes, list(shard.shape)))
                if rc != OK:
                    return rc
            return OK
        except (_Invalid, TypeError, ValueError) as e:
            _log.error("%s(%s): %s", method, key, e)
            return INVALID_PARAMS

    def _batch(self, method, keys, count, parallelisms, writer_partitions, one, direct):
        keys = list(keys)
        if parallelisms is not None and writer_partitions is not None:
            _log.error("%s: writer_partitions cannot be combined with parallelisms", method)
            return [INVALID_PARAMS] * len(keys)
        if count != len(keys):
            _log.error("%s: %d keys but %d values", method, len(keys), count)
            return [INVALID_PARAMS] * len(keys)
        if parallelisms is None and writer_partitions is None:
            return direct()
        requests = parallelisms if parallelisms is not None else writer_partitions
        if not isinstance(requests, list) or len(requests) != len(keys):
            _log.error("%s: the requests must be a list as long as keys", method)
            return [INVALID_PARAMS] * len(keys)
        if parallelisms is not None:
            return [one(i, r, None) for i, r in enumerate(requests)]
        return [one(i, None, r) for i, r in enumerate(requests)]

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None):
        self._require("put_tensor_with_parallelism")
        return self._write_tensor("put_tensor_with_parallelism", key, tensor, parallelism,
                                  config, writer_partition, False)

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None):
        self._require("upsert_tensor_with_parallelism")
        return self._write_tensor("upsert_tensor_with_parallelism", key, tensor, parallelism,
                                  config, writer_partition, True)

    def _batch_tensors(self, method, keys, tensors_list, parallelisms, config,
                       writer_partitions, upsert):
        self._require(method)
        keys, tensors = list(keys), list(tensors_list)
        return self._batch(
            method, keys, len(tensors), parallelisms, writer_partitions,
            lambda i, p, w: self._write_tensor(method, keys[i], tensors[i], p, config, w,
                                               upsert),
            lambda: self._put_tensors(method, keys, tensors, config, upsert))

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                          config=None, writer_partitions=None):
        return self._batch_tensors("batch_put_tensor_with_parallelism", keys, tensors_list,
                                   parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                             config=None, writer_partitions=None):
        return self._batch_tensors("batch_upsert_tensor_with_parallelism", keys, tensors_list,
                                   parallelisms, config, writer_partitions, True)

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None):
        self._require("put_tensor_with_parallelism_from")
        return self._write_from("put_tensor_with_parallelism_from", key, buffer_ptr, size,
                                parallelism, config, writer_partition, False)

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                            config=None, writer_partition=None):
        self._require("upsert_tensor_with_parallelism_from")
        return self._write_from("upsert_tensor_with_parallelism_from", key, buffer_ptr, size,
                                parallelism, config, writer_partition, True)

    def _batch_from(self, method, keys, buffer_ptrs, sizes, parallelisms, config,
                    writer_partitions, upsert):
        self._require(method)
        keys, ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if len(sizes) != len(ptrs):
            return [INVALID_PARAMS] * len(keys)
        direct = self.batch_upsert_tensor_from if upsert else self.batch_put_tensor_from
        return self._batch(
            method, keys, len(ptrs), parallelisms, writer_partitions,
            lambda i, p, w: self._write_from(method, keys[i], ptrs[i], sizes[i], p, config, w,
                                             upsert),
            lambda: direct(keys, ptrs, sizes, config))

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                               parallelisms=None, config=None,
                                               writer_partitions=None):
        return self._batch_from("batch_put_tensor_with_parallelism_from", keys, buffer_ptrs,
                                sizes, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                                  parallelisms=None, config=None,
                                                  writer_partitions=None):
        return self._batch_from("batch_upsert_tensor_with_parallelism_from", keys, buffer_ptrs,
                                sizes, parallelisms, config, writer_partitions, True)
