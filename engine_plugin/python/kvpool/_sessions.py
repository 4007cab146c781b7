"""Mooncake's put/get session calls over kvpool (RealClient's batch_*_session_* and the
ranged multi-buffer calls), for engines that write or read an object in pieces (a layer at a
time):

    batch_put_session_start(keys, sizes, config=None)      -> per key 0 or negative
    batch_put_from_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_dst_offsets)
                                                            -> per key the bytes written
    batch_put_session_end(keys)                             -> per key 0 or negative
    batch_put_session_revoke(keys)                          -> per key 0 or negative
    batch_get_session_start(keys)                           -> per key 0 or negative
    batch_get_into_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_src_offsets)
                                                            -> per key the bytes read
    batch_get_session_end(keys)                             -> 0

Mooncake reserves the objects at put-session start and writes each range straight into the
segment; kvpool gathers a put session's ranges in this process's memory and stores the object
when the session ends (one put: space is taken then, so pressure answers -200 there, and until
then other clients do not see the key being written). A get session reads each object once at
its start (which leases it, as Mooncake's query does) and serves the ranges from that copy.
Session state is per store object and thread-safe. A range outside its object, or a key with
no open session, is -600 (INVALID_PARAMS) for that key; nothing is copied for it.
"""

import ctypes
import logging
import threading

from kvpool import _kvpool

_log = logging.getLogger("kvpool.store")

OK = 0
INVALID_PARAMS = _kvpool.INVALID_PARAMS
OBJECT_NOT_FOUND = _kvpool.OBJECT_NOT_FOUND


class _PutSession:
    __slots__ = ("buffer", "config")

    def __init__(self, size, config):
        self.buffer = (ctypes.c_char * max(size, 1))()
        self.config = config


class SessionMixin:
    """The session calls of MooncakeDistributedStore (see the module docstring)."""

    def _sessions(self):
        # Created on first use: the store's __init__ belongs to the native base class.
        state = self.__dict__.get("_session_state")
        if state is None:
            state = self.__dict__.setdefault("_session_state",
                                             (threading.Lock(), {}, {}))
        return state  # (lock, put sessions {key: _PutSession}, get sessions {key: bytes})

    def batch_put_session_start(self, keys, sizes, config=None):
        self._require("batch_put_session_start")
        keys, sizes = list(keys), list(sizes)
        if len(keys) != len(sizes) or not self._check_config("batch_put_session_start",
                                                              config):
            return [INVALID_PARAMS] * len(keys)
        lock, puts, _ = self._sessions()
        out = []
        with lock:
            for key, size in zip(keys, sizes):
                if not key or int(size) <= 0:
                    out.append(INVALID_PARAMS)
                    continue
                puts[key] = _PutSession(int(size), config)
                out.append(OK)
        return out

    @staticmethod
    def _ranges_fit(sizes, offsets, object_size):
        return all(0 <= o and 0 <= n and o + n <= object_size for n, o in zip(sizes, offsets))

    def batch_put_from_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_dst_offsets):
        self._require("batch_put_from_multi_buffer_ranges")
        keys = list(keys)
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets):
            return [INVALID_PARAMS] * len(keys)
        lock, puts, _ = self._sessions()
        out = []
        with lock:
            for key, ptrs, sizes, offsets in zip(keys, all_buffer_ptrs, all_sizes,
                                                 all_dst_offsets):
                session = puts.get(key)
                if session is None or not len(ptrs) == len(sizes) == len(offsets) or \
                        not self._ranges_fit(sizes, offsets, len(session.buffer)):
                    _log.error("batch_put_from_multi_buffer_ranges(%s): no open put session "
                               "or a range outside the object", key)
                    out.append(INVALID_PARAMS)
                    continue
                base = ctypes.addressof(session.buffer)
                for ptr, n, off in zip(ptrs, sizes, offsets):
                    ctypes.memmove(base + off, ptr, n)
                out.append(sum(sizes))
        return out

    def batch_put_session_end(self, keys):
        self._require("batch_put_session_end")
        keys = list(keys)
        lock, puts, _ = self._sessions()
        with lock:
            sessions = [puts.pop(k, None) for k in keys]
        out = [INVALID_PARAMS] * len(keys)
        for i, (key, s) in enumerate(zip(keys, sessions)):
            if s is not None:
                out[i] = self._put_ptrs("batch_put_session_end", [key],
                                        [[ctypes.addressof(s.buffer)]], [[len(s.buffer)]],
                                        s.config)[0]
        return out

    def batch_put_session_revoke(self, keys):
        self._require("batch_put_session_revoke")
        lock, puts, _ = self._sessions()
        with lock:
            return [OK if puts.pop(k, None) is not None else INVALID_PARAMS for k in keys]

    def batch_get_session_start(self, keys):
        self._require("batch_get_session_start")
        keys = list(keys)
        values = _kvpool.Store._get_values(self, keys) if keys else []
        lock, _, gets = self._sessions()
        out = []
        with lock:
            for key, value in zip(keys, values):
                if isinstance(value, bytes):
                    gets[key] = value
                    out.append(OK)
                else:
                    gets.pop(key, None)
                    out.append(value if isinstance(value, int) else OBJECT_NOT_FOUND)
        return out

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_src_offsets):
        self._require("batch_get_into_multi_buffer_ranges")
        keys = list(keys)
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets):
            return [INVALID_PARAMS] * len(keys)
        lock, _, gets = self._sessions()
        with lock:
            values = [gets.get(k) for k in keys]
        out = []
        for key, value, ptrs, sizes, offsets in zip(keys, values, all_buffer_ptrs, all_sizes,
                                                    all_src_offsets):
            if value is None or not len(ptrs) == len(sizes) == len(offsets) or \
                    not self._ranges_fit(sizes, offsets, len(value)):
                _log.error("batch_get_into_multi_buffer_ranges(%s): no open get session or a "
                           "range outside the object", key)
                out.append(INVALID_PARAMS)
                continue
            for ptr, n, off in zip(ptrs, sizes, offsets):
                ctypes.memmove(ptr, value[off:off + n], n)
            out.append(sum(sizes))
        return out

    def batch_get_session_end(self, keys):
        self._require("batch_get_session_end")
        lock, _, gets = self._sessions()
        with lock:
            for k in keys:
                gets.pop(k, None)
        return OK
