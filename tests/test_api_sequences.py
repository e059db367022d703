"""No pure-Python sequence of calls crashes the interpreter (issue 43).

Random sequences of the calls a user can make on sockets (the shared-memory and ZMQ
backends, and the fake layer over them), on receive_view views, on reservations and on
VisionIPC buffers, in random order: close, reconnect, fork, threads, sockets dropped
without a close, queue files damaged and replaced under the sockets (as by another
process), and objects kept past their blocks (slices, memoryviews, numpy arrays)
used after everything they came from was closed. Exceptions are fine; a process killed
by a signal is not. The sequences run in child processes (each runs many, one after the
other); a child (or a grandchild it forked) that dies by a signal fails the test with the
seed and the sequence that did it.

``MSGQ_API_SEQUENCES`` sets how many sequences run (default 5000),
``MSGQ_API_SEQUENCES_SEED`` the first seed (default 0). One sequence is replayed, in
this process, with ``python tests/test_api_sequences.py replay SEED``.
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

#: Sequences run by the test (``MSGQ_API_SEQUENCES``) and its first seed.
SEQUENCES = int(os.environ.get("MSGQ_API_SEQUENCES", "5000"))
FIRST_SEED = int(os.environ.get("MSGQ_API_SEQUENCES_SEED", "0"))
#: Child processes the sequences are split over (they run side by side).
WORKERS = 2
#: Seconds a forked child may take before it counts as hung.
FORK_WAIT_S = float(os.environ.get("MSGQ_API_SEQUENCES_FORK_WAIT_S", "20"))
#: Calls per sequence (before the closing part every sequence ends with).
CALLS = (8, 30)
#: Small queues: opening one maps and faults in its whole ring.
SEGMENT_SIZES = (0x4000, 0x10000)
ENDPOINTS = ("seq_a", "seq_a", "seq_a", "seq_b")
VIPC_NAMES = ("seqcam_a", "seqcam_a", "seqcam_b")
#: Share of sequences per socket layer (the rest runs on shared memory, plain).
MODES = (("msgq", 0.55), ("fake", 0.25), ("zmq", 0.20))

Op = tuple[Any, ...]


# --------------------------------------------------------------------------- sequences


def _pick_mode(rng: random.Random) -> str:
    x = rng.random()
    for mode, share in MODES:
        if x < share:
            return mode
        x -= share
    return MODES[0][0]


def _ops(rng: random.Random, n: int, vipc: bool, fork_depth: int) -> list[Op]:
    """``n`` random calls. Slots (pub 0-1, sub 0-2, kept object 0-7, open reservation or
    view 0-2) are named by number; a call on an empty slot does nothing."""
    # Not pickle.PickleBuffer, though it holds a buffer as C extensions do: CPython 3.11
    # itself segfaults collecting a cycle that holds a memoryview and a PickleBuffer of
    # it (memoryview's tp_clear), with no msgq object involved; tests/test_reserve.py
    # holds one outside any cycle.
    keep_kinds = ("none", "none", "slice", "memoryview", "numpy", "whole")

    def pub() -> int:  # the first slot most of the time: calls meet the same socket
        return 0 if rng.random() < 0.8 else 1

    def sub() -> int:
        return rng.choice((0, 0, 1, 1, 2))

    table: list[tuple[int, Callable[[], Op]]] = [
        (4, lambda: ("pub", pub(), rng.choice(ENDPOINTS), rng.choice(SEGMENT_SIZES))),
        (4, lambda: ("sub", sub(), rng.choice(ENDPOINTS), rng.choice(SEGMENT_SIZES),
                     rng.random() < 0.3)),
        (6, lambda: ("send", pub(), rng.choice((0, 1, 8, 300, 5000)))),
        (2, lambda: ("send_kept", pub(), rng.randrange(8))),
        (7, lambda: ("reserve", pub(), rng.choice((0, 1, 16, 1000)),
                     rng.choice(("with", "with", "raise", "enter", "open")),
                     rng.choice(keep_kinds))),
        (2, lambda: ("commit", rng.randrange(3))),
        (2, lambda: ("abort", rng.randrange(3))),
        (2, lambda: ("write_open", rng.randrange(3))),
        (5, lambda: ("receive", sub())),
        (2, lambda: ("receive_into", sub(), rng.choice((-1, *range(8))))),
        (6, lambda: ("view", sub(), rng.choice(("with", "with", "raise", "enter")),
                     rng.choice(keep_kinds), rng.random() < 0.2)),
        (2, lambda: ("view_exit", rng.randrange(3))),
        (3, lambda: ("close_pub", pub())),
        (3, lambda: ("close_sub", sub())),
        (2, lambda: ("reconnect_pub", pub(), rng.choice(ENDPOINTS),
                     rng.choice(SEGMENT_SIZES))),
        (2, lambda: ("reconnect_sub", sub(), rng.choice(ENDPOINTS),
                     rng.choice(SEGMENT_SIZES))),
        (1, lambda: ("drop_pub", pub())),
        (1, lambda: ("drop_sub", sub())),
        (2, lambda: ("poll", sub())),
        (1, lambda: ("readers", pub())),
        (1, lambda: ("drain", sub())),
        (1, lambda: ("receive_async", sub(), rng.choice(("wait", "cancel", "close")))),
        (1, lambda: ("thread_close", sub(), rng.random() < 0.5)),
        (4, lambda: ("replace_file", rng.choice(ENDPOINTS), rng.choice(SEGMENT_SIZES))),
        (5, lambda: ("use_kept", rng.randrange(8), rng.random() < 0.5)),
        (2, lambda: ("drop_kept", rng.randrange(8))),
        (1, lambda: ("gc",)),
    ]
    if vipc:
        table += [
            (2, lambda: ("vipc_server", rng.choice(VIPC_NAMES), rng.choice((1, 2, 3)),
                         rng.choice((8, 64)), rng.choice((2, 16)))),
            (3, lambda: ("vipc_send", rng.randrange(256))),
            (1, lambda: ("vipc_send_kept", rng.randrange(8))),
            (2, lambda: ("vipc_client", rng.choice(VIPC_NAMES), rng.random() < 0.5)),
            (3, lambda: ("vipc_recv",)),
            (3, lambda: ("vipc_keep", rng.choice(("data", "array", "y", "uv", "slice",
                                                  "server", "whole")))),
            (1, lambda: ("vipc_close_server",)),
            (1, lambda: ("vipc_close_client",)),
            (1, lambda: ("vipc_drop",)),
        ]
    if fork_depth == 0:
        table.append((1, lambda: ("fork", rng.randrange(2**31))))
    weights = [w for w, _ in table]
    makers = [m for _, m in table]
    return [rng.choices(makers, weights)[0]() for _ in range(n)]


def sequence(seed: int) -> tuple[str, list[Op]]:
    """The socket layer and the calls of sequence ``seed``: random calls, then every
    socket closed in random order, every kept object used, and everything dropped."""
    rng = random.Random(seed)
    mode = _pick_mode(rng)
    seg = rng.choice(SEGMENT_SIZES)
    # A world to start from: a publisher and two subscribers of one endpoint (and a
    # VisionIPC server and client), which the random calls then use, close and replace.
    ops: list[Op] = [("sub", 0, ENDPOINTS[0], seg, False), ("sub", 1, ENDPOINTS[0], seg, True),
                     ("pub", 0, ENDPOINTS[0], seg)]
    if mode != "zmq" and rng.random() < 0.5:
        ops += [("vipc_server", VIPC_NAMES[0], 2, 16, 4), ("vipc_client", VIPC_NAMES[0], False),
                ("vipc_send", 1), ("vipc_recv",)]
    ops += _ops(rng, rng.randint(*CALLS), vipc=mode != "zmq", fork_depth=0)
    ending: list[Op] = [("close_pub", i) for i in range(2)] + [("close_sub", i) for i in range(3)]
    ending += [("vipc_close_server",), ("vipc_close_client",)]
    rng.shuffle(ending)
    ops += ending
    ops += [("use_kept", k, True) for k in range(8)]
    ops.append(("end",))
    return mode, ops


def fork_ops(seed: int) -> list[Op]:
    """What a forked child of a sequence does before it exits."""
    rng = random.Random(seed)
    ops = _ops(rng, rng.randint(2, 8), vipc=True, fork_depth=1)
    return ops + [("use_kept", k, True) for k in range(8)]


def describe(seed: int) -> str:
    """Sequence ``seed`` as text, a call a line (a fork's calls indented under it)."""
    mode, ops = sequence(seed)
    lines = [f"seed {seed}, socket layer {mode}:"]
    for op in ops:
        lines.append(f"  {op[0]}{op[1:]}")
        if op[0] == "fork":
            lines += [f"      (child) {c[0]}{c[1:]}" for c in fork_ops(op[1])]
    return "\n".join(lines)


# --------------------------------------------------------------------------- running


class ForkedChildError(Exception):
    """A forked child of a sequence died by a signal, or hung."""


class Runner:
    """Runs calls on a small world of sockets, open blocks and kept objects."""

    def __init__(self, msgq: Any, np: Any) -> None:
        self.msgq, self.np = msgq, np
        self.pubs: list[Any] = [None] * 2
        self.subs: list[Any] = [None] * 3
        self.kept: list[Any] = [None] * 8
        self.open_res: list[Any] = [None] * 3  # (reservation, its view or None)
        self.open_views: list[Any] = [None] * 3  # (MessageView, its view)
        self.poller: Any = None
        self.vserver: Any = None
        self.vclient: Any = None
        self.vbuf: Any = None
        self.forked = False  # running the calls of a fork()ed child

    def keep(self, obj: Any, kind: str, rng_slot: int) -> None:
        np = self.np
        if kind == "none" or obj is None:
            return
        made = {
            "slice": lambda: obj[: max(0, len(obj) - 1)] if isinstance(obj, memoryview) else obj,
            "memoryview": lambda: memoryview(obj),
            "numpy": lambda: np.frombuffer(obj, dtype=np.uint8),
            "whole": lambda: obj,
        }[kind]()
        self.kept[rng_slot % 8] = made

    #: Calls made, and those that raised, by name and exception type (``stats`` mode).
    outcomes: dict[tuple[str, str], int] = {}

    def run(self, ops: list[Op], fork_depth: int = 0) -> None:
        for i, op in enumerate(ops):
            outcome = "ok"
            try:
                getattr(self, "op_" + op[0])(i, *op[1:])
            except ForkedChildError:
                raise
            except Exception as e:
                outcome = type(e).__name__
            key = (op[0], outcome)
            self.outcomes[key] = self.outcomes.get(key, 0) + 1

    # sockets
    def op_pub(self, i: int, slot: int, ep: str, seg: int) -> None:
        self.pubs[slot] = self.msgq.pub_sock(ep, segment_size=seg)

    def op_sub(self, i: int, slot: int, ep: str, seg: int, conflate: bool) -> None:
        self.subs[slot] = self.msgq.sub_sock(ep, conflate=conflate, timeout=0, segment_size=seg)

    def op_send(self, i: int, slot: int, n: int) -> None:
        self.pubs[slot].send(bytes([i % 256]) * n)

    def op_send_kept(self, i: int, slot: int, k: int) -> None:
        self.pubs[slot].send(self.kept[k])

    def op_reserve(self, i: int, slot: int, n: int, how: str, keep: str) -> None:
        res = self.pubs[slot].reserve(n)
        if how == "open":
            self.open_res[i % 3] = (res, None)
            return
        if how == "enter":
            buf = res.__enter__()
            buf[:] = bytes([i % 256]) * n
            self.keep(buf, keep, i)
            self.open_res[i % 3] = (res, buf)
            return
        try:
            with res as buf:
                buf[: min(n, 4)] = b"abcd"[: min(n, 4)]
                self.keep(buf, keep, i)
                if how == "raise":
                    raise KeyError("abandon")
        except KeyError:
            pass
        if keep != "none" and i % 2:
            self.kept[(i + 3) % 8] = res

    def op_commit(self, i: int, k: int) -> None:
        if self.open_res[k] is not None:
            self.open_res[k][0].commit()

    def op_abort(self, i: int, k: int) -> None:
        if self.open_res[k] is not None:
            self.open_res[k][0].abort()

    def op_write_open(self, i: int, k: int) -> None:
        if self.open_res[k] is not None and self.open_res[k][1] is not None:
            buf = self.open_res[k][1]
            buf[:] = bytes(len(buf))

    def op_receive(self, i: int, slot: int) -> None:
        self.subs[slot].receive(non_blocking=True)

    def op_receive_into(self, i: int, slot: int, k: int) -> None:
        target = bytearray(6000) if k < 0 else self.kept[k]
        self.subs[slot].receive_into(target, non_blocking=True)

    def op_view(self, i: int, slot: int, how: str, keep: str, readable: bool) -> None:
        mv = self.subs[slot].receive_view(non_blocking=True)
        if how == "enter":
            view = mv.__enter__()
            self.keep(view, keep, i)
            if readable:
                mv.keep_readable()
            self.open_views[i % 3] = (mv, view)
            return
        try:
            with mv as view:
                if view is not None:
                    bytes(view[:4])
                self.keep(view, keep, i)
                if readable:
                    mv.keep_readable()
                if how == "raise":
                    raise KeyError("abandon")
        except KeyError:
            pass

    def op_view_exit(self, i: int, k: int) -> None:
        if self.open_views[k] is not None:
            mv, _ = self.open_views[k]
            self.open_views[k] = None
            mv.__exit__(None, None, None)

    def op_close_pub(self, i: int, slot: int) -> None:
        if self.pubs[slot] is not None:
            self.pubs[slot].close()

    def op_close_sub(self, i: int, slot: int) -> None:
        if self.subs[slot] is not None:
            self.subs[slot].close()

    def op_reconnect_pub(self, i: int, slot: int, ep: str, seg: int) -> None:
        self.pubs[slot].connect(self.msgq.context, ep, seg)

    def op_reconnect_sub(self, i: int, slot: int, ep: str, seg: int) -> None:
        self.subs[slot].connect(self.msgq.context, ep, segment_size=seg)

    def op_drop_pub(self, i: int, slot: int) -> None:
        self.pubs[slot] = None

    def op_drop_sub(self, i: int, slot: int) -> None:
        self.subs[slot] = None

    def op_poll(self, i: int, slot: int) -> None:
        if self.poller is None:
            self.poller = self.msgq.Poller()
        if self.subs[slot] is not None:
            self.poller.registerSocket(self.subs[slot])
        self.poller.poll(0)

    def op_readers(self, i: int, slot: int) -> None:
        pub = self.pubs[slot]
        _ = pub.num_readers
        pub.all_readers_updated()

    def op_drain(self, i: int, slot: int) -> None:
        self.msgq.drain_sock_raw(self.subs[slot])

    def op_receive_async(self, i: int, slot: int, how: str) -> None:
        import asyncio

        sock = self.subs[slot]

        async def run() -> None:
            task = asyncio.ensure_future(sock.receive_async())
            await asyncio.sleep(0)
            if how == "close":  # closing the socket fails the task awaiting it
                sock.close()
            elif how == "cancel":
                task.cancel()
            await asyncio.wait([task], timeout=0.002)
            task.cancel()
            try:
                await task
            except BaseException:
                pass

        if sock is not None:
            asyncio.run(run())

    def op_thread_close(self, i: int, slot: int, reconnect: bool) -> None:
        sock = self.subs[slot]
        sock.setTimeout(2)

        def receive() -> None:
            try:
                for _ in range(3):
                    sock.receive()
            except Exception:
                pass

        thread = threading.Thread(target=receive)
        thread.start()
        try:  # while the other thread is (most likely) inside receive
            if reconnect:
                sock.connect(self.msgq.context, sock.endpoint)
            else:
                sock.close()
        finally:
            thread.join()

    def op_replace_file(self, i: int, ep: str, seg: int) -> None:
        # As another process damaging a queue file: the next opener (a throwaway
        # subscriber here) renames a new queue into its place, and every socket on the
        # old one follows it at its next call (O6) while buffers may still point into
        # the old ring. (On ZMQ it hits a file no socket uses, or none: FileNotFoundError.)
        from msgq import shm_backend

        with open(shm_backend.queue_path(ep), "r+b") as f:
            f.write(bytes(8))
        sock = shm_backend.SubSocket()
        sock.connect(self.msgq.context, ep, segment_size=seg)
        sock.close()

    def op_use_kept(self, i: int, k: int, write: bool) -> None:
        obj = self.kept[k]
        if obj is None:
            return
        np = self.np
        if isinstance(obj, np.ndarray):
            int(obj.sum())
            if write and obj.size and obj.flags.writeable:
                obj[:1] = 7
            return
        if hasattr(obj, "__enter__") and not isinstance(obj, memoryview):  # a Reservation
            obj.commit()
            return
        view = memoryview(obj)
        bytes(view[:8])
        if write and view.nbytes and not view.readonly:
            view[:1] = b"z"

    def op_drop_kept(self, i: int, k: int) -> None:
        self.kept[k] = None

    def op_gc(self, i: int) -> None:
        gc.collect(0)  # the youngest objects: this sequence's cycles (full ones: _child)

    # VisionIPC
    def op_vipc_server(self, i: int, name: str, n: int, w: int, h: int) -> None:
        from msgq.visionipc import VisionIpcServer

        server = VisionIpcServer(name)
        self.vserver = server
        server.create_buffers(0, n, w, h)
        server.start_listener()

    def op_vipc_send(self, i: int, frame: int) -> None:
        server = self.vserver
        buf = server.get_buffer(0)
        buf.data[:1] = bytes([frame])
        server.send(0, buf, frame_id=frame)

    def op_vipc_send_kept(self, i: int, k: int) -> None:
        self.vserver.send(0, self.kept[k], frame_id=i)

    def op_vipc_client(self, i: int, name: str, conflate: bool) -> None:
        from msgq.visionipc import VisionIpcClient

        self.vclient = VisionIpcClient(name, 0, conflate)
        self.vclient.connect(False)

    def op_vipc_recv(self, i: int) -> None:
        buf = self.vclient.recv(timeout_ms=0)
        if buf is not None:
            self.vbuf = buf

    def op_vipc_keep(self, i: int, kind: str) -> None:
        buf = self.vbuf
        if kind == "server" and self.vserver is not None:
            buf = self.vserver.get_buffer(0)
            self.kept[i % 8] = buf.data
            return
        if buf is None:
            return
        self.kept[i % 8] = {
            "data": lambda: buf.data,
            "array": lambda: buf.array,
            "y": lambda: buf.y,
            "uv": lambda: buf.uv,
            "slice": lambda: buf.data[1:],
            "whole": lambda: buf,
        }[kind]()

    def op_vipc_close_server(self, i: int) -> None:
        if self.vserver is not None:
            self.vserver.close()

    def op_vipc_close_client(self, i: int) -> None:
        if self.vclient is not None:
            self.vclient.close()

    def op_vipc_drop(self, i: int) -> None:
        self.vserver = self.vclient = self.vbuf = None

    # fork and the end
    def op_fork(self, i: int, seed: int) -> None:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            self.forked = True
            try:
                self.run(fork_ops(seed), fork_depth=1)
            except BaseException:
                code = 1
            os._exit(code)
        give_up = time.monotonic() + FORK_WAIT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > give_up:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise ForkedChildError(f"forked child hung for {FORK_WAIT_S} s")
            time.sleep(0.0002)
        if os.WIFSIGNALED(status):
            raise ForkedChildError(
                f"forked child killed by signal {signal.Signals(os.WTERMSIG(status)).name}")

    def op_end(self, i: int) -> None:
        for k in range(3):  # open blocks left open end now, as the with would have
            if self.open_views[k] is not None:
                self.op_view_exit(i, k)
            if self.open_res[k] is not None:
                try:
                    self.open_res[k][0].abort()
                except Exception:
                    pass


def _select(mode: str) -> None:
    os.environ["MSGQ_BACKEND"] = "zmq" if mode == "zmq" else "msgq"
    os.environ["CEREAL_FAKE"] = "1" if mode == "fake" else "0"
    os.environ["MSGQ_ZMQ_LINGER"] = "0"  # a closed publisher drops what it had queued


def run_one(seed: int) -> None:
    """Runs sequence ``seed`` in this process."""
    import numpy as np

    import msgq

    mode, ops = sequence(seed)
    _select(mode)
    runner = Runner(msgq, np)
    runner.run(ops)
    # Everything goes now: the sockets in their slots are dropped (deallocated) with
    # whatever blocks and buffers still refer to them.
    del runner


def _child(first: int, count: int) -> int:
    """Runs ``count`` sequences from seed ``first``, printing each seed before it runs it
    (the parent reads which one a signal interrupted), and ``failed: SEED why`` for a
    sequence whose forked child died by a signal or hung."""
    import faulthandler
    import warnings

    faulthandler.enable()  # a signal's traceback goes to stderr, shown with the failure
    warnings.simplefilter("ignore")
    os.environ.setdefault("CEREAL_FAKE_PREFIX", f"seq_{os.getpid()}")
    out = sys.stdout
    for seed in range(first, first + count):
        out.write(f"{seed}\n")
        out.flush()
        try:
            run_one(seed)
        except ForkedChildError as e:
            out.write(f"failed: {seed} {e}\n")
            out.flush()
        if seed % 64 == 63:
            gc.collect()
    out.write("done\n")
    out.flush()
    return 0


def _describe_failure(seed: int, what: str, stderr: str = "") -> str:
    text = (f"sequence {seed}: {what}; replay it with "
            f"`python tests/test_api_sequences.py replay {seed}`:\n{describe(seed)}")
    return text + (f"\nstderr (end): {stderr[-1500:]}" if stderr.strip() else "")


def run_sequences(first: int, count: int, env: dict[str, str], deadline: float,
                  failures: list[str]) -> int:
    """Runs seeds ``first`` .. ``first + count - 1`` in child processes, one after the
    other; a child killed by a signal is recorded with its sequence, and a new child goes
    on from the next seed. Returns how many sequences ran."""
    ran = 0
    seed = first
    while seed < first + count:
        try:
            child = subprocess.run(
                [sys.executable, __file__, "child", str(seed), str(first + count - seed)],
                capture_output=True, text=True, env=env, start_new_session=True,
                timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            seeds = [int(x) for x in out.splitlines() if x.isdigit()]
            failures.append(_describe_failure(seeds[-1] if seeds else seed,
                                              "still running at the test's deadline"))
            return ran + len(seeds)
        lines = child.stdout.splitlines()
        seeds = [int(x) for x in lines if x.isdigit()]
        ran += len(seeds)
        for line in lines:
            if line.startswith("failed: "):
                failed, why = line[len("failed: "):].split(" ", 1)
                failures.append(_describe_failure(int(failed), why))
        if child.returncode == 0 and lines and lines[-1] == "done":
            break
        last = seeds[-1] if seeds else seed
        rc = child.returncode
        why = (f"killed by signal {signal.Signals(-rc).name}" if rc < 0
               else f"exit status {rc}")
        failures.append(_describe_failure(last, why, child.stderr))
        seed = last + 1
    return ran


@pytest.mark.timeout(600)
def test_no_sequence_of_calls_kills_the_process(prefix: str) -> None:
    started = time.monotonic()
    per_worker = -(-SEQUENCES // WORKERS)
    failures: list[str] = []
    counts: list[int] = []
    prefixes = [f"{prefix}_w{w}" for w in range(WORKERS)]

    def worker(w: int) -> None:
        first = FIRST_SEED + w * per_worker
        count = max(0, min(per_worker, FIRST_SEED + SEQUENCES - first))
        env = dict(os.environ, MSGQ_PREFIX=prefixes[w])
        env.pop("ZMQ", None)
        counts.append(run_sequences(first, count, env, started + 540, failures))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shm = os.environ.get("MSGQ_SHM_DIR", "/dev/shm")
        for name in prefixes:
            shutil.rmtree(os.path.join(shm, name), ignore_errors=True)
    summary = "\n".join(f.split(";", 1)[0] for f in failures)
    assert not failures, (f"{len(failures)} sequence(s) failed:\n{summary}\n\nthe first:\n"
                          + "\n\n".join(failures[:2]))
    assert sum(counts) == SEQUENCES
    print(f"{sum(counts)} sequences, 0 signals, {time.monotonic() - started:.1f} s")


# --------------------------------------------------------------------------- found here
# Defects the sequences found, each pinned by a test that fails without its fix.


def test_reconnect_refuses_when_a_receive_started_during_its_open(endpoint: str) -> None:
    """connect() checks that no other thread is inside a call, then opens the new queue
    without the GIL; a receive that started meanwhile slept on the old handle, which
    connect then closed under it (a use-after-free; a segfault in the sequences)."""
    import fcntl

    import msgq
    from msgq import shm_backend
    from msgq.errors import IpcError

    other = endpoint + "_next"
    msgq.pub_sock(other, segment_size=0x4000).close()  # the file to move to exists
    sub = msgq.sub_sock(endpoint, timeout=400, segment_size=0x4000)
    with open(shm_backend.queue_path(other), "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # connect() to `other` waits, without the GIL

        def receive() -> None:
            time.sleep(0.03)  # connect() waits for the lock by now
            sub.receive()  # sleeps on the old ring without the GIL

        def unlock() -> None:
            time.sleep(0.15)
            fcntl.flock(lock, fcntl.LOCK_UN)

        threads = [threading.Thread(target=receive), threading.Thread(target=unlock)]
        for t in threads:
            t.start()
        try:
            with pytest.raises(IpcError, match="another thread is receiving"):
                sub.connect(msgq.context, other, segment_size=0x4000)
        finally:
            for t in threads:
                t.join()
    assert sub.endpoint == endpoint  # still on the old queue, which still works
    pub = msgq.pub_sock(endpoint, segment_size=0x4000)
    pub.send(b"still here")
    assert sub.receive() == b"still here"
    sub.close()
    pub.close()


def test_registering_with_a_poller_another_thread_polls_is_refused(endpoint: str) -> None:
    """A socket registered while another thread polled was counted out of the poll
    without having been counted in (its busy count went negative: close refused
    forever), and growing the handle arrays freed them under the poll."""
    import msgq
    from msgq.errors import IpcError

    first = msgq.sub_sock(endpoint, segment_size=0x4000)
    second = msgq.sub_sock(endpoint + "_2", segment_size=0x4000)
    poller = msgq.Poller()
    poller.registerSocket(first)
    polling = threading.Thread(target=poller.poll, args=(300,))
    polling.start()
    time.sleep(0.05)
    try:
        with pytest.raises(IpcError, match="another thread is polling this Poller"):
            poller.registerSocket(second)
    finally:
        polling.join()
    poller.registerSocket(second)  # once the poll returned
    assert poller.poll(0) == []
    first.close()
    second.close()


KEPT_PAST_REPLACEMENT = r"""
import subprocess, sys
import msgq
from msgq import shm_backend

ep, kind = sys.argv[1], sys.argv[2]
pub = msgq.pub_sock(ep, segment_size=0x4000)
sub = msgq.sub_sock(ep, segment_size=0x4000, timeout=0)
if kind == "reserve":
    with pub.reserve(1000) as buf:
        buf[:4] = b"abcd"
        kept = buf[:16]
else:
    pub.send(b"abcd" * 4)
    with sub.receive_view() as view:
        kept = view[:16]
# Another process damages the queue file; its next opener renames a new queue into place.
code = (f"import msgq; from msgq import shm_backend\n"
        f"with open(shm_backend.queue_path({ep!r}), 'r+b') as f: f.write(bytes(8))\n"
        f"msgq.pub_sock({ep!r}, segment_size=0x4000)\n")
subprocess.run([sys.executable, "-c", code], check=True)
for _ in range(3):  # O6: the socket follows the endpoint to the new file
    try:
        pub.send(b"after") if kind == "reserve" else sub.receive()
    except msgq.IpcError:
        pass
if kind == "reserve":
    kept[0:4] = b"zzzz"
print("kept buffer still usable:", bytes(kept[:4]), flush=True)
"""


@pytest.mark.parametrize("kind", ["reserve", "view"])
def test_a_buffer_kept_past_its_block_survives_its_queue_file_being_replaced(
        prefix: str, endpoint: str, kind: str) -> None:
    # A slice of a reserve() block (or of a receive_view view) kept past the block holds
    # the ring mapped against close and reconnect; but when another process replaced
    # the queue file, the socket's next send (receive) followed the endpoint to the new
    # file and unmapped the old ring under the slice: its next use was a segfault.
    done = subprocess.run([sys.executable, "-c", KEPT_PAST_REPLACEMENT, endpoint, kind],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode >= 0, f"killed by signal {signal.Signals(-done.returncode).name}"
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kept buffer still usable" in done.stdout


# --------------------------------------------------------------------------- threads
# Calls another thread makes on the same socket while a large copy runs without the GIL.

RECEIVE_BESIDE_A_COPY = r"""
import sys, threading
import msgq
from msgq import shm_backend

ep, rounds = sys.argv[1], int(sys.argv[2])
SEG, BIG = 0x1000000, 5 << 20
into = bytearray(BIG)  # faulted in: copying into it is quicker than into fresh bytes
refused = 0
for n in range(rounds):
    pub = msgq.pub_sock(ep, segment_size=SEG)
    sub = msgq.sub_sock(ep, segment_size=SEG, timeout=1000)
    pub.send(b"x" * BIG)
    # Another opener replaces the damaged file; sub reads the old one to its end first.
    with open(shm_backend.queue_path(ep), "r+b") as f:
        f.write(bytes(8))
    opener = shm_backend.SubSocket()
    opener.connect(msgq.context, ep, segment_size=0x4000)
    opener.close()
    other = threading.Thread(target=sub.receive)
    other.start()  # copies the message into new bytes without the GIL
    try:
        sub.receive_into(into, non_blocking=True)
        sub.receive(non_blocking=True)  # the old file read: follows it (O6), unmapping it
    except msgq.IpcError as e:
        assert "another thread is receiving on this socket" in str(e), e
        refused += 1
    other.join()
    pub.close()
    sub.close()
print("refused", refused, flush=True)
"""


def test_a_receive_beside_another_threads_copy_is_refused(prefix: str, endpoint: str) -> None:
    # A receive copies a large message out of the ring without the GIL. A receive in
    # another thread meanwhile took the same message, then followed the replaced queue
    # file (O6) and unmapped the old ring under the first thread's copy: SIGSEGV in
    # every child (2 of 2) before receive refused while another thread copies.
    refused = 0
    for run in range(2):
        done = subprocess.run([sys.executable, "-c", RECEIVE_BESIDE_A_COPY, endpoint, "15"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode >= 0, (
            f"child {run} killed by signal {signal.Signals(-done.returncode).name}")
        assert done.returncode == 0, done.stderr[-2000:]
        refused += int(done.stdout.split()[-1])
    assert refused > 0, "the two threads never overlapped: the test proved nothing"


SEND_BESIDE_A_SEND = r"""
import json, sys, threading
import msgq

ep, rounds = sys.argv[1], int(sys.argv[2])
SEG, BIG = 0x1000000, 5 << 20
failed_sends, refused, other_errors = [], 0, []
pub = msgq.pub_sock(ep, segment_size=SEG)
sub = msgq.sub_sock(ep, segment_size=SEG, timeout=1000)


def send() -> None:
    try:
        pub.send(b"x" * BIG)
    except Exception as e:
        failed_sends.append(repr(e))


for n in range(rounds):
    other = threading.Thread(target=send)
    other.start()  # copies 5 MiB into the ring without the GIL
    try:
        if n % 2:
            pub.send(b"small")
        else:
            pub.reserve(16).abort()
    except msgq.IpcError as e:
        if "another thread is sending on this socket" in str(e):
            refused += 1
        else:
            other_errors.append(str(e))
    other.join()
    while sub.receive(non_blocking=True) is not None:
        pass
print(json.dumps({"refused": refused, "failed_sends": failed_sends,
                  "other_errors": other_errors}), flush=True)
"""


def test_a_send_or_reserve_beside_another_threads_send_is_refused(
        prefix: str, endpoint: str) -> None:
    # A large send copies into the ring without the GIL, inside a reservation of the
    # handle. A reserve or send in another thread meanwhile shared that one reservation:
    # it failed with "Device or resource busy", or, when it got in first, the large
    # send failed (EBUSY) or lost its message ("commit without a matching reserve");
    # had it followed a replaced file (O6) it would have unmapped the ring under the
    # copy. Both now raise IpcError at once while another thread sends.
    done = subprocess.run([sys.executable, "-c", SEND_BESIDE_A_SEND, endpoint, "30"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode >= 0, f"killed by signal {signal.Signals(-done.returncode).name}"
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["failed_sends"] == [], result
    assert result["other_errors"] == [], result
    assert result["refused"] > 0, "the two threads never overlapped: the test proved nothing"


if __name__ == "__main__":
    if sys.argv[1] == "child":
        sys.exit(_child(int(sys.argv[2]), int(sys.argv[3])))
    if sys.argv[1] == "stats":  # what the calls of N sequences did (the test's reach)
        import warnings

        warnings.simplefilter("ignore")
        for seed in range(int(sys.argv[2])):
            run_one(seed)
        for (name, outcome), n in sorted(Runner.outcomes.items()):
            print(f"{name:20s} {outcome:28s} {n}")
        sys.exit(0)
    if sys.argv[1] == "replay":
        print(describe(int(sys.argv[2])), flush=True)
        run_one(int(sys.argv[2]))
        print("no signal")
