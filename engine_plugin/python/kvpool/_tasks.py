"""Mooncake's copy and move tasks over kvpool (create_copy_task, create_move_task, query_task):

    create_copy_task(key, targets)          -> ((high, low) task id, 0) or ((0, 0), negative)
    create_move_task(key, source, target)   -> ((high, low) task id, 0) or ((0, 0), negative)
    query_task(task_id)                     -> (QueryTaskResponse, 0) or (None, -1400)

A copy gives the object a replica on every segment named in `targets` (one holding one already
is skipped); a move puts a replica on `target` in place of the one on `source`, which the master
drops in the same step that commits the new one, so the object never lacks a committed replica.
The bytes are copied by this process as a drain's mover copies (kvpool::Client::CopyReplica:
read from a replica, checked against the object's checksum, written where the master reserved
space); a failure leaves the object as it was.

Creating a task checks it at once, with Mooncake's codes: -704 (OBJECT_NOT_FOUND) for a key
without a committed object, -600 (INVALID_PARAMS) for no targets, a segment no one mounted, a
move's source without a replica or equal to its target, -1010 (UNAVAILABLE_IN_CURRENT_STATUS)
for a target that takes no new objects. The task then runs in a worker thread of this store:
PENDING until a worker takes it, PROCESSING, then SUCCESS or FAILED (a full target, -200, or a
transfer that failed, -800, among others; QueryTaskResponse.message names the code).

The task table lives in this store (this process), not in the master: kvpool's master keeps no
state per client and is never on the data path, and the process that copies the bytes is the
one that asked. A task is visible to the process that created it and ends with it; a copy cut
off by its end is reclaimed by the master after its put timeout, the object untouched.
Finished tasks are kept (the most recent _MAX_FINISHED) so that they can still be queried.
"""

import concurrent.futures
import os
import threading
import time
from collections import OrderedDict
from enum import IntEnum

from kvpool import _kvpool

OK = 0
TASK_NOT_FOUND = -1400
_MAX_FINISHED = 10000
_WORKERS = 8


class TaskType(IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(IntEnum):
    # Mooncake's numbering (task_manager.h): FAILED before SUCCESS.
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


def _now_ms():
    return int(time.time() * 1000)


class QueryTaskResponse:
    """What query_task answers about one task (Mooncake's fields)."""

    __slots__ = ("id", "type", "status", "created_at_ms_epoch", "last_updated_at_ms_epoch",
                 "assigned_client", "message", "error_code")

    def __init__(self):
        self.id = (0, 0)
        self.type = TaskType.REPLICA_COPY
        self.status = TaskStatus.PENDING
        self.created_at_ms_epoch = 0
        self.last_updated_at_ms_epoch = 0
        # The client that runs it: this store's (Mooncake names the source's client).
        self.assigned_client = (0, 0)
        self.message = ""
        # kvpool's addition: the code the task failed with (0 while not failed).
        self.error_code = 0

    def _copy(self):
        out = QueryTaskResponse()
        for name in self.__slots__:
            setattr(out, name, getattr(self, name))
        return out

    def __repr__(self):
        return (f"QueryTaskResponse(id={self.id}, type={int(self.type)}, "
                f"status={int(self.status)}, created_at={self.created_at_ms_epoch}, "
                f"last_updated_at={self.last_updated_at_ms_epoch}, "
                f"assigned_client={self.assigned_client}, message=\"{self.message}\")")


class TaskMixin:
    """The task calls of MooncakeDistributedStore (see the module docstring)."""

    def _tasks(self):
        # Created on first use: the store's __init__ belongs to the native base class.
        state = self.__dict__.get("_task_state")
        if state is None:
            state = self.__dict__.setdefault("_task_state", {
                "lock": threading.Lock(),
                "tasks": OrderedDict(),  # id -> QueryTaskResponse, in creation order
                "client": (int.from_bytes(os.urandom(8), "little"), 0),
                "next": 1,
                "pool": None,
            })
        return state

    def _submit_task(self, kind, key, targets, move_from):
        code, message = _kvpool.Store._copy_replica(self, key, targets, move_from, True)
        if code != OK:
            self._log_task_refusal(kind, key, code, message)
            return (0, 0), code
        state = self._tasks()
        with state["lock"]:
            task = QueryTaskResponse()
            task.id = (state["client"][0], state["next"])
            state["next"] += 1
            task.type = kind
            task.created_at_ms_epoch = task.last_updated_at_ms_epoch = _now_ms()
            task.assigned_client = state["client"]
            state["tasks"][task.id] = task
            self._forget_finished_locked(state)
            if state["pool"] is None:
                state["pool"] = concurrent.futures.ThreadPoolExecutor(
                    max_workers=_WORKERS, thread_name_prefix="kvpool-task")
            pool = state["pool"]
        pool.submit(self._run_task, task.id, key, list(targets), move_from)
        return task.id, OK

    def _run_task(self, task_id, key, targets, move_from):
        state = self._tasks()
        with state["lock"]:
            task = state["tasks"].get(task_id)
            if task is None:
                return
            task.status = TaskStatus.PROCESSING
            task.last_updated_at_ms_epoch = _now_ms()
        try:
            code, message = _kvpool.Store._copy_replica(self, key, targets, move_from, False)
        except Exception as e:  # a store closed meanwhile, ...
            code, message = -1, str(e)
        with state["lock"]:
            task.status = TaskStatus.SUCCESS if code == OK else TaskStatus.FAILED
            task.error_code = code
            task.message = ("Task completed successfully" if code == OK else
                            f"{_kvpool.error_code_name(code)} ({code}): {message}")
            task.last_updated_at_ms_epoch = _now_ms()

    @staticmethod
    def _forget_finished_locked(state):
        tasks = state["tasks"]
        if len(tasks) <= _MAX_FINISHED:
            return
        for task_id in [i for i, t in tasks.items()
                        if t.status in (TaskStatus.SUCCESS, TaskStatus.FAILED)]:
            if len(tasks) <= _MAX_FINISHED:
                break
            del tasks[task_id]

    def _log_task_refusal(self, kind, key, code, message):
        import logging
        logging.getLogger("kvpool.store").error(
            "%s of key %s refused: %s (%d): %s",
            "copy" if kind == TaskType.REPLICA_COPY else "move", key,
            _kvpool.error_code_name(code), code, message)

    def create_copy_task(self, key, targets):
        """Copies key's object to every segment of targets (names); returns (task id, 0), or
        ((0, 0), negative code) when the task is refused at once (see the module docstring)."""
        self._require("create_copy_task")
        return self._submit_task(TaskType.REPLICA_COPY, key, list(targets), "")

    def create_move_task(self, key, source, target):
        """Moves key's replica on segment source to segment target; returns (task id, 0), or
        ((0, 0), negative code)."""
        self._require("create_move_task")
        if not source:
            # An empty source would make the request a copy.
            return (0, 0), _kvpool.INVALID_PARAMS
        return self._submit_task(TaskType.REPLICA_MOVE, key, [target], source)

    def query_task(self, task_id):
        """(QueryTaskResponse, 0) for a task this store created, else (None, -1400)."""
        self._require("query_task")
        state = self._tasks()
        with state["lock"]:
            task = state["tasks"].get(tuple(task_id))
            if task is None:
                return None, TASK_NOT_FOUND
            return task._copy(), OK

    def _stop_tasks(self):
        state = self.__dict__.get("_task_state")
        if state is not None and state["pool"] is not None:
            state["pool"].shutdown(wait=True)
            state["pool"] = None
