"""The stub's private machinery: the framed socket, the two shared-memory
pools and the tensor codecs (docs/python-backend.md, "The stub protocol").

Nothing here is model API: models use triton_python_backend_utils. Both that
module and nereid_stub.py use this one, so there is exactly one runtime per
process (nereid_stub.py runs as __main__, so it must not be imported twice).
"""

import array
import collections
import ctypes
import json
import mmap
import os
import socket
import struct
import sys
import threading
import weakref

import numpy as np

MAX_FRAME = 64 << 20
_ALIGN = 64
_HEADER = 16
_LIVE, _FREED, _WRAP = 1, 2, 3

# Room for the descriptors one read may bring (a segment frame carries one).
_FDS_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)

_u32 = struct.Struct("<I")
# One encoder for every frame: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
# json.loads on bytes guesses their encoding in Python first; frames are UTF-8.
_raw_decode = json.JSONDecoder().raw_decode
# socket's MSG_* are IntFlags, whose operators run in Python on every use.
_MSG_CTRUNC = int(socket.MSG_CTRUNC)
_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)
_header = struct.Struct("<IIQ")

# KServe datatype name -> numpy dtype (little-endian); BYTES is handled apart.
DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_KIND_SIZE = {
    ("b", 1): "BOOL",
    ("u", 1): "UINT8",
    ("u", 2): "UINT16",
    ("u", 4): "UINT32",
    ("u", 8): "UINT64",
    ("i", 1): "INT8",
    ("i", 2): "INT16",
    ("i", 4): "INT32",
    ("i", 8): "INT64",
    ("f", 2): "FP16",
    ("f", 4): "FP32",
    ("f", 8): "FP64",
}


def datatype_of(dtype):
    """The KServe datatype name of a numpy dtype, or None."""
    kind = dtype.kind
    if kind in "OSU":
        return "BYTES"
    return _KIND_SIZE.get((kind, dtype.itemsize))


class ShmError(Exception):
    """A tensor that the stub's pool cannot hold."""


def eprint(*parts):
    try:
        print("nereid_stub:", *parts, file=sys.stderr, flush=True)
    except Exception:
        pass


def lost_connection():
    """The server is gone: the stub has nothing left to do."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(0)


# ---------------------------------------------------------------- the socket


class Channel:
    """Two Unix stream sockets, one each way (`rsock` brings the server's
    frames, `wsock` takes the stub's), framed as 4-byte LE length + JSON; a
    `segment` frame carries a descriptor beside it (SCM_RIGHTS), kept in
    `fds` in the order they came.

    Writes: one lock around each whole frame. Reads: leader/follower. Any
    thread that waits for something only a frame can bring (the main loop
    for its next message, a BLS call for its response) calls pump_until: if
    nobody is reading it becomes the reader, reads one frame, dispatches it
    (under the lock) and re-checks; otherwise it waits on the condition for
    the reader's notify. So the plain execute path has no thread hop: the
    main thread reads the socket itself.
    """

    def __init__(self, rsock, wsock, dispatch):
        self.rsock = rsock
        self.wsock = wsock
        self.dispatch = dispatch  # called with each message, under self.cond
        self.wlock = threading.Lock()
        self.cond = threading.Condition(threading.Lock())
        self.reading = False
        self.eof = False
        self._buf = bytearray()
        self._pos = 0
        self.fds = collections.deque()

    # -- writing

    def send(self, obj, fd=None):
        """Sends one frame; with `fd`, that descriptor goes with it."""
        data = _encode(obj).encode("utf-8")
        if len(data) > MAX_FRAME:
            raise ValueError(
                "a %r message of %d bytes is over the protocol's 64 MiB frame limit"
                % (obj.get("op"), len(data))
            )
        frame = _u32.pack(len(data)) + data
        with self.wlock:
            try:
                if fd is None:
                    self.wsock.sendall(frame)
                else:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                    sent = self.wsock.sendmsg([frame], rights)
                    if sent < len(frame):
                        self.wsock.sendall(frame[sent:])
            except OSError as e:
                eprint("lost the server's socket while sending:", e)
                lost_connection()

    # -- reading (only the thread holding self.reading touches the buffer)

    def _complete_frame_buffered(self):
        avail = len(self._buf) - self._pos
        if avail < 4:
            return False
        n = _u32.unpack_from(self._buf, self._pos)[0]
        return avail >= 4 + n

    def _read_frame(self):
        """The next frame's bytes, or None at end of file."""
        buf = self._buf
        while True:
            avail = len(buf) - self._pos
            need = 4
            if avail >= 4:
                n = _u32.unpack_from(buf, self._pos)[0]
                if n > MAX_FRAME:
                    raise ConnectionError("a frame of %d bytes is over the 64 MiB limit" % n)
                need = 4 + n
                if avail >= need:
                    start = self._pos + 4
                    data = buf[start : start + n]
                    self._pos = start + n
                    if self._pos == len(buf):
                        del buf[:]
                        self._pos = 0
                    return data
            if self._pos:
                del buf[: self._pos]
                self._pos = 0
            chunk = self._recv(max(65536, need - avail))
            if not chunk:
                return None
            buf += chunk

    def _recv(self, n):
        chunk, ancillary, flags, _ = self.rsock.recvmsg(n, _FDS_SPACE)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        if flags & _MSG_CTRUNC:
            raise ConnectionError("more descriptors came with one message than the protocol allows")
        return chunk

    def _readable_now(self):
        if self._complete_frame_buffered():
            return True
        try:
            peek = self.rsock.recv(1, _PEEK_NOW)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True  # let the read report it
        return True  # data, or b"" (end of file): both are for the reader

    def pump_until(self, pred, block=True):
        """Reads and dispatches frames until pred() (checked under the lock)
        is true; returns pred's value, or a false one at end of file (or,
        with block=False, when no frame is waiting)."""
        with self.cond:
            while True:
                r = pred()
                if r or self.eof:
                    return r
                if self.reading:
                    if not block:
                        return r
                    self.cond.wait()
                    continue
                if not block and not self._readable_now():
                    return r
                self.reading = True
                self.cond.release()
                try:
                    try:
                        data = self._read_frame()
                    except ConnectionError as e:
                        eprint("the socket is unusable:", e)
                        data = None
                    except OSError as e:
                        eprint("reading the socket failed:", e)
                        data = None
                finally:
                    self.cond.acquire()
                    self.reading = False
                if data is None:
                    self.eof = True
                    try:
                        self.dispatch(None)
                    except Exception as e:  # pragma: no cover
                        eprint("end-of-file handling failed:", repr(e))
                else:
                    try:
                        self.dispatch(decode_frame(data))
                    except Exception as e:
                        eprint("dropped a bad message:", repr(e), data[:200])
                self.cond.notify_all()

    def poll(self):
        """Dispatches the frames already waiting, without blocking."""
        if self.reading or self.eof:
            return
        self.pump_until(_never, block=False)


def _never():
    return False


def decode_frame(data):
    """The JSON object of one frame's bytes."""
    text = data.decode("utf-8")
    msg, end = _raw_decode(text)
    if end != len(text) or not isinstance(msg, dict):
        raise ValueError("a frame that is not one JSON object")
    return msg


# --------------------------------------------------------- shared memory


def _align(n):
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


class _Ring:
    """One segment of the stub's pool: blocks go at `head`, reclaimed in
    allocation order once the server has written `freed` into them."""

    __slots__ = ("mm", "size", "head", "blocks", "wrapped", "index")

    def __init__(self, index, mm, size):
        self.index = index
        self.mm = mm
        self.size = size
        self.head = 0
        self.blocks = collections.deque()  # block offsets, oldest first; -1 = wrap
        self.wrapped = False

    def reclaim(self):
        blocks = self.blocks
        mm = self.mm
        while blocks:
            b = blocks[0]
            if b < 0:
                blocks.popleft()
                self.wrapped = False
                continue
            if _u32.unpack_from(mm, b)[0] != _FREED:
                break
            blocks.popleft()
        if not blocks:
            self.head = 0
            self.wrapped = False

    def try_alloc(self, need):
        """The offset of a new block of `need` bytes (header included), or None."""
        blocks = self.blocks
        head = self.head
        if not blocks:
            if need > self.size:
                return None
            at = 0
        elif self.wrapped:
            if head + need > blocks[0]:
                return None
            at = head
        elif head + need <= self.size:
            at = head
        else:
            tail = blocks[0]
            if need > tail:
                return None
            if head < self.size:
                _u32.pack_into(self.mm, head, _WRAP)
            blocks.append(-1)
            self.wrapped = True
            at = 0
        blocks.append(at)
        self.head = at + need
        return at


class StubPool:
    """The pool the stub allocates: anonymous memory files, each sent to
    the server with `announce(index, fd)` as it is made, before any
    descriptor can name it."""

    def __init__(self, default_size, growth_size, limit, announce):
        self.announce = announce
        self.default_size = max(_ALIGN, int(default_size))
        self.growth_size = max(_ALIGN, int(growth_size))
        self.limit = int(limit)
        self.rings = []
        self.total = 0
        self.lock = threading.Lock()
        with self.lock:
            self._grow(self.default_size, 0)

    def _grow(self, size, nbytes):
        size = _align(size)
        if self.total + size > self.limit:
            raise ShmError(
                "a tensor of %d bytes does not fit in the stub's shared memory: its "
                "segments hold %d bytes that are still in use and a new segment of %d "
                "bytes would pass shm-limit-byte-size (%d bytes)"
                % (nbytes, self.total, size, self.limit)
            )
        index = len(self.rings)
        name = "nereid-stub-s%d" % index
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError as e:
            raise ShmError("cannot create the shared-memory segment %s: %s" % (name, e))
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    import errno

                    if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                        raise ShmError(
                            "cannot reserve %d bytes for the shared-memory segment %s: %s"
                            % (size, name, e)
                        )
            mm = mmap.mmap(fd, size)
        except ShmError:
            os.close(fd)
            raise
        except OSError as e:
            os.close(fd)
            raise ShmError("cannot size the shared-memory segment %s: %s" % (name, e))
        try:
            self.announce(index, fd)
        finally:
            os.close(fd)
        ring = _Ring(index, mm, size)
        self.rings.append(ring)
        self.total += size
        return ring

    def alloc(self, nbytes):
        """(segment index, data offset, mmap) of a new live block of nbytes."""
        need = _align(_HEADER + nbytes)
        with self.lock:
            at = None
            for ring in self.rings:
                ring.reclaim()
                at = ring.try_alloc(need)
                if at is not None:
                    break
            if at is None:
                ring = self._grow(max(self.growth_size, need), nbytes)
                at = ring.try_alloc(need)
            _header.pack_into(ring.mm, at, _LIVE, 0, nbytes)
            return ring.index, at + _HEADER, ring.mm

    def release(self, seg, off):
        """Gives back a block the server never saw."""
        if 0 <= seg < len(self.rings):
            _u32.pack_into(self.rings[seg].mm, off - _HEADER, _FREED)


class HostPool:
    """The server's pool: its segments, mapped as the server announces
    them (a `segment` frame and its descriptor)."""

    def __init__(self):
        self.maps = {}

    def add(self, seg, fd):
        try:
            self.maps[seg] = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def segment(self, seg):
        mm = self.maps.get(seg)
        if mm is None:
            raise ValueError("the server never announced its segment %r" % (seg,))
        return mm


def _free_host(mm, off):
    try:
        _u32.pack_into(mm, off - _HEADER, _FREED)
    except Exception:  # pragma: no cover - interpreter shutdown
        pass


def free_host_block(pool, desc):
    """Frees the block of a host descriptor without reading it."""
    seg = desc.get("seg", -1)
    if seg is None or seg < 0 or not desc.get("len"):
        return
    try:
        _free_host(pool.segment(seg), desc["off"])
    except Exception as e:
        eprint("could not free a host block:", repr(e))


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def read_tensor(pool, desc):
    """A numpy array for a host descriptor. Fixed-size types are views of
    the segment; the block is freed when the last reference to the data is
    gone. BYTES become an object array (a copy) and the block is freed now."""
    datatype = desc["datatype"]
    shape = desc["shape"]
    seg = desc.get("seg", -1)
    length = desc.get("len", 0)
    if datatype == "BYTES":
        count = _count(shape)
        if seg is None or seg < 0 or length == 0:
            if count:
                raise ValueError("BYTES tensor %r of %d elements has no data" % (desc.get("name"), count))
            return np.empty(shape, dtype=np.object_)
        mm = pool.segment(seg)
        off = desc["off"]
        try:
            return _parse_bytes(mm, off, length, count, desc.get("name")).reshape(shape)
        finally:
            _free_host(mm, off)
    dtype = DTYPES.get(datatype)
    if dtype is None:
        if seg is not None and seg >= 0 and length:
            free_host_block(pool, desc)
        raise ValueError("tensor %r has an unknown datatype %r" % (desc.get("name"), datatype))
    expected = _prod(shape) * dtype.itemsize
    if seg is None or seg < 0 or length == 0:
        if expected:
            raise ValueError("tensor %r of shape %s has no data" % (desc.get("name"), list(shape)))
        return np.empty(shape, dtype=dtype)
    mm = pool.segment(seg)
    off = desc["off"]
    if length != expected:
        _free_host(mm, off)
        raise ValueError(
            "tensor %r: %d bytes of data for shape %s of %s (%d bytes)"
            % (desc.get("name"), length, list(shape), datatype, expected)
        )
    # The array's base is a ctypes object made for this block alone: numpy
    # views of views keep it alive, and when it dies the block is freed.
    holder = _char_array(length).from_buffer(mm, off)
    ref = _weakref(holder, _holder_gone)
    _held[id(ref)] = (ref, mm, off)
    return np.frombuffer(holder, dtype=dtype).reshape(shape)


_char_arrays = {}


def _char_array(n):
    t = _char_arrays.get(n)
    if t is None:
        if len(_char_arrays) > 4096:
            _char_arrays.clear()
        t = _char_arrays[n] = ctypes.c_char * n
    return t


# The host blocks that input arrays still use, by the id of a weak
# reference to their holder; the reference's callback frees the block.
# (weakref.finalize does the same, in Python code, at several times the cost.)
_held = {}
_weakref = weakref.ref


def _holder_gone(ref):
    _, mm, off = _held.pop(id(ref))
    _free_host(mm, off)

try:
    from math import prod as _prod
except ImportError:  # Python < 3.8
    _prod = _count


def _parse_bytes(mm, off, length, count, name):
    out = np.empty(count, dtype=np.object_)
    pos = off
    end = off + length
    unpack = _u32.unpack_from
    for i in range(count):
        if pos + 4 > end:
            raise ValueError("BYTES tensor %r is shorter than its %d elements" % (name, count))
        n = unpack(mm, pos)[0]
        pos += 4
        if pos + n > end:
            raise ValueError("BYTES tensor %r has an element past its data" % (name,))
        out[i] = mm[pos : pos + n]
        pos += n
    return out


def _element_bytes(e):
    if isinstance(e, bytes):
        return e
    if isinstance(e, str):
        return e.encode("utf-8")
    if isinstance(e, (bytearray, memoryview)):
        return bytes(e)
    if isinstance(e, np.ndarray) and e.ndim == 0:
        return _element_bytes(e.item())
    # Triton's own serializer turns other objects into their str().
    return str(e).encode("utf-8")


def serialize_bytes(array):
    """Triton's BYTES serialization of a numpy array (object, S or U)."""
    parts = []
    pack = _u32.pack
    for e in array.flat if array.ndim else [array.item()]:
        b = _element_bytes(e)
        parts.append(pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def write_tensor(pool, name, array, datatype):
    """The descriptor of `array` copied (once) into a new block of the stub pool."""
    shape = [int(d) for d in array.shape]
    if datatype == "BYTES":
        data = serialize_bytes(array)
        n = len(data)
        if n == 0:
            return {"name": name, "datatype": datatype, "shape": shape, "seg": -1, "off": 0, "len": 0}
        seg, off, mm = pool.alloc(n)
        mm[off : off + n] = data
        return {"name": name, "datatype": datatype, "shape": shape, "seg": seg, "off": off, "len": n}
    dtype = DTYPES[datatype]
    n = array.size * dtype.itemsize
    if n == 0:
        return {"name": name, "datatype": datatype, "shape": shape, "seg": -1, "off": 0, "len": 0}
    seg, off, mm = pool.alloc(n)
    try:
        if array.dtype == dtype and array.flags.c_contiguous:
            # The common case: one copy, straight from the array's buffer.
            mm[off : off + n] = array.data.cast("B")
        else:
            dst = np.frombuffer(mm, dtype=dtype, count=array.size, offset=off)
            np.copyto(dst.reshape(array.shape), array, casting="unsafe")
            del dst
    except BaseException:
        pool.release(seg, off)
        raise
    return {"name": name, "datatype": datatype, "shape": shape, "seg": seg, "off": off, "len": n}


# ------------------------------------------------------------- the runtime


class ExecState:
    """What the stub knows of an execute's requests: the key of the first
    (the others follow it) and their cancellations."""

    __slots__ = ("first", "cancelled")

    def __init__(self, first, n):
        self.first = first
        self.cancelled = [False] * n


class Call:
    """A BLS call in flight."""

    __slots__ = ("id", "items", "final", "lost", "future", "loop")

    def __init__(self, call_id):
        self.id = call_id
        self.items = collections.deque()
        self.final = False
        self.lost = False  # the socket closed before its final message
        self.future = None
        self.loop = None


class Runtime:
    def __init__(self, rsock, wsock):
        self.channel = Channel(rsock, wsock, self._dispatch)
        self.main_q = collections.deque()
        # The requests the server may still cancel, by key: (their
        # ExecState, their index in it). A decoupled model's stay until
        # their final response, across executes; others' until executed.
        self.live = {}
        self.calls = {}
        self.next_call = 1
        self.async_pending = 0
        self.pumper_running = False
        self.stub_pool = None
        self.host_pool = HostPool()
        self.decoupled = False
        self.current = None  # the stub's per-execute bookkeeping (nereid_stub.Execution)
        self._ids = 0
        self._ids_lock = threading.Lock()

    def new_id(self):
        with self._ids_lock:
            self._ids += 1
            return self._ids

    # -- dispatch: runs on whichever thread read the frame, under channel.cond

    def _dispatch(self, msg):
        if msg is None:  # end of file: every waiter gives up
            for call in list(self.calls.values()):
                call.lost = True
                self._finish(call)
            self.calls.clear()
            return
        op = msg.get("op")
        if op == "segment":
            fds = self.channel.fds
            if not fds:
                eprint("segment", msg.get("seg"), "came without its descriptor")
                return
            self.host_pool.add(msg.get("seg"), fds.popleft())
        elif op == "bls_response":
            call = self.calls.get(msg.get("call"))
            response = msg.get("response")
            if call is None:
                eprint("a bls_response for an unknown call", msg.get("call"))
                if isinstance(response, dict):
                    for d in response.get("outputs") or ():
                        free_host_block(self.host_pool, d)
                return
            if response is not None:
                call.items.append(response)
            if msg.get("final"):
                del self.calls[call.id]
                self._finish(call)
        elif op == "cancelled":
            # A request that has just ended may be cancelled as it ends.
            live = self.live.get(msg.get("request"))
            if live is not None:
                live[0].cancelled[live[1]] = True
        elif op == "execute":
            first = msg.get("first") or 0
            n = len(msg.get("requests") or ())
            state = ExecState(first, n)
            for i in range(n):
                self.live[first + i] = (state, i)
            msg["_state"] = state
            self.main_q.append(msg)
        elif op in ("init", "auto_complete", "finalize"):
            self.main_q.append(msg)
        else:
            eprint("ignored a message with op", repr(op))

    def _finish(self, call):
        call.final = True
        if call.future is not None:
            self.async_pending -= 1
            try:
                call.loop.call_soon_threadsafe(_resolve, call.future)
            except RuntimeError:  # its loop is closed
                pass

    # -- the main loop

    def next_main(self):
        q = self.main_q
        if self.channel.pump_until(lambda: len(q) > 0):
            return q.popleft()
        return None

    # -- BLS calls

    def start_call(self, msg, loop=None, future=None):
        """Registers a call, sends it; the Call."""
        with self.channel.cond:
            call_id = self.next_call
            self.next_call += 1
            call = Call(call_id)
            if self.channel.eof:
                call.final = True
                call.lost = True
                return call
            self.calls[call_id] = call
            if future is not None:
                call.loop = loop
                call.future = future
                self.async_pending += 1
                if not self.pumper_running:
                    self.pumper_running = True
                    threading.Thread(target=self._pump_async, name="nereid-bls", daemon=True).start()
        msg["call"] = call_id
        try:
            self.channel.send(msg)
        except BaseException:
            with self.channel.cond:
                if self.calls.pop(call_id, None) is not None:
                    self._finish(call)
            raise
        return call

    def _pump_async(self):
        """Reads the socket for async_exec callers while any is in flight
        (their loop runs on a thread that cannot wait here)."""

        def done():
            if self.async_pending <= 0:
                self.pumper_running = False
                return True
            return False

        try:
            self.channel.pump_until(done)
        finally:
            with self.channel.cond:
                if self.channel.eof:
                    self.pumper_running = False

    def wait_call(self, call):
        self.channel.pump_until(lambda: call.final)

    def next_item(self, call):
        """(response dict or None, final) for a decoupled call's iterator."""
        ch = self.channel

        def ready():
            return len(call.items) > 0 or call.final

        ch.pump_until(ready)
        with ch.cond:
            if call.items:
                return call.items.popleft(), False
            return None, True


def _resolve(future):
    if not future.done():
        future.set_result(None)


RUNTIME = None


def install(rsock, wsock):
    global RUNTIME
    RUNTIME = Runtime(rsock, wsock)
    return RUNTIME
