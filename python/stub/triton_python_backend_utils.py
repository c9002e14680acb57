"""Nereid's `triton_python_backend_utils`: the API that Triton Python-backend
models import as `pb_utils`, implemented over Nereid's stub protocol
(docs/python-backend.md). Written for Nereid from Triton's documented API.
"""

import json
import sys
import threading

import numpy as np

import nereid_stub_shm as _rt

__all__ = [
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "TritonError",
    "TritonModelException",
    "Logger",
    "LogLevel",
    "MetricFamily",
    "Metric",
    "ModelConfig",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "using_decoupled_model_transaction_policy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
]

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2

# Triton's data-type numbers (model_config.proto's TYPE_* = TRITONSERVER_TYPE_*).
_TYPE_NUMBERS = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
}
_TYPE_NAMES = {v: k for k, v in _TYPE_NUMBERS.items()}


def _runtime():
    rt = _rt.RUNTIME
    if rt is None:
        raise TritonModelException("this works only inside Nereid's Python stub")
    return rt


class TritonModelException(Exception):
    """Raised by pb_utils calls that a model uses wrongly."""


# --------------------------------------------------------------- errors


class TritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _NAMES = (
        "UNKNOWN",
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
    )

    def __init__(self, message, code=INTERNAL):
        if isinstance(code, str):
            code = self._NAMES.index(code) if code in self._NAMES else self.INTERNAL
        self._message = str(message)
        self._code = code if code in range(len(self._NAMES)) else self.INTERNAL

    def message(self):
        return self._message

    def code(self):
        return self._code

    def _to_wire(self):
        return {"message": self._message, "code": self._NAMES[self._code]}

    def __repr__(self):
        return "TritonError(%r, %s)" % (self._message, self._NAMES[self._code])

    __str__ = message


def _error_from_wire(e):
    if isinstance(e, dict):
        return TritonError(e.get("message", ""), e.get("code", "INTERNAL"))
    return TritonError(str(e))


# --------------------------------------------------------------- tensors


class _DLPackCapsule:
    """Lets numpy import a bare DLPack capsule."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, **_kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return _capsule_device(self._capsule)


_DL_CUDA = 2
_capsule_pointer = None


def _capsule_device(capsule):
    """(device type, id) of an unconsumed DLPack capsule, read from its
    DLTensor without taking it: `data` (a pointer), then the DLDevice."""
    import ctypes

    global _capsule_pointer
    if _capsule_pointer is None:
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        _capsule_pointer = get_pointer
    try:
        managed = _capsule_pointer(capsule, b"dltensor")
    except ValueError:
        raise TritonModelException("not a DLPack capsule (or one already consumed)")
    device = (ctypes.c_int32 * 2).from_address(managed + ctypes.sizeof(ctypes.c_void_p))
    return (int(device[0]), int(device[1]))


def _gpu_import(producer):
    """A CUDA DLPack tensor as the GPU library that made it sees it: torch
    when it is importable, else CuPy. The memory stays on the device."""
    try:
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack(producer)
    except ImportError:
        pass
    try:
        import cupy

        return cupy.from_dlpack(producer)
    except ImportError:
        raise TritonModelException("a GPU tensor needs torch or cupy in the model's Python environment")


def _gpu_dtype(gpu):
    """The numpy dtype of a torch or CuPy tensor."""
    dtype = gpu.dtype
    if isinstance(dtype, np.dtype):
        return dtype
    try:
        # torch spells its dtypes `torch.float32`: numpy's names after the dot.
        return np.dtype(str(dtype).replace("torch.", ""))
    except TypeError:
        raise TritonModelException("GPU tensors of %s have no Triton datatype here" % dtype)


def _gpu_to_host(gpu):
    """A copy of a GPU tensor in host memory (torch waits for its stream)."""
    if hasattr(gpu, "detach"):
        return gpu.detach().cpu().numpy()
    return gpu.get()


class Tensor:
    """A named tensor: a numpy array, or a tensor in GPU memory (from a
    DLPack capsule a model made with torch or CuPy), copied to the host
    once, when the response or request carrying it leaves the stub."""

    __slots__ = ("_name", "_array", "_datatype", "_gpu", "__weakref__")

    def __init__(self, name, data, *_ignored):
        if not isinstance(data, np.ndarray):
            data = np.asarray(data)
        datatype = _rt.datatype_of(data.dtype)
        if datatype is None:
            raise TritonModelException(
                "tensor %r: numpy dtype %s has no Triton datatype" % (name, data.dtype)
            )
        self._name = str(name)
        self._array = data
        self._datatype = datatype
        self._gpu = None

    @classmethod
    def _wrap(cls, name, array, datatype):
        t = cls.__new__(cls)
        t._name = name
        t._array = array
        t._datatype = datatype
        t._gpu = None
        return t

    def name(self):
        return self._name

    def as_numpy(self):
        if self._gpu is not None:
            raise TritonModelException(
                "tensor %r is in GPU memory: as_numpy() reads CPU tensors (to_dlpack() gives the GPU tensor)"
                % self._name
            )
        return self._array

    def shape(self):
        if self._gpu is not None:
            return [int(d) for d in self._gpu.shape]
        return list(self._array.shape)

    def triton_dtype(self):
        return _TYPE_NUMBERS[self._datatype]

    def is_cpu(self):
        return self._gpu is None

    def to_dlpack(self):
        if self._gpu is not None:
            return self._gpu.__dlpack__()
        if self._datatype == "BYTES":
            raise TritonModelException("tensor %r: BYTES tensors have no DLPack form" % self._name)
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name, capsule):
        producer = capsule if hasattr(capsule, "__dlpack__") else _DLPackCapsule(capsule)
        try:
            device_type = int(producer.__dlpack_device__()[0])
        except TritonModelException:
            raise
        except Exception as e:
            raise TritonModelException("tensor %r: cannot read the DLPack tensor's device: %s" % (name, e))
        if device_type == _DL_CUDA:
            gpu = _gpu_import(producer)
            datatype = _rt.datatype_of(_gpu_dtype(gpu))
            if datatype is None or datatype == "BYTES":
                raise TritonModelException("tensor %r: GPU dtype %s has no Triton datatype" % (name, gpu.dtype))
            t = Tensor._wrap(str(name), None, datatype)
            t._gpu = gpu
            return t
        try:
            array = np.from_dlpack(producer)
        except Exception as e:
            raise TritonModelException(
                "tensor %r: cannot import the DLPack tensor (CPU and CUDA memory are supported): %s" % (name, e)
            )
        return Tensor(name, array)

    def __repr__(self):
        where = "GPU" if self._gpu is not None else "CPU"
        return "Tensor(%r, %s, shape=%s, %s)" % (self._name, self._datatype, self.shape(), where)


def _tensor_to_wire(rt, tensor):
    if not isinstance(tensor, Tensor):
        raise TritonModelException("expected a pb_utils.Tensor, got %s" % type(tensor).__name__)
    array = tensor._array if tensor._gpu is None else _gpu_to_host(tensor._gpu)
    return _rt.write_tensor(rt.stub_pool, tensor._name, array, tensor._datatype)


def _tensor_from_wire(rt, desc):
    return Tensor._wrap(desc["name"], _rt.read_tensor(rt.host_pool, desc), desc["datatype"])


def _check_parameters(parameters, what):
    """A dict of str -> str/int/bool from a dict or JSON text."""
    if parameters is None:
        return {}
    if isinstance(parameters, (str, bytes)):
        try:
            parameters = json.loads(parameters) if parameters else {}
        except ValueError as e:
            raise TritonModelException("%s parameters are not valid JSON: %s" % (what, e))
    if not isinstance(parameters, dict):
        raise TritonModelException(
            "%s parameters must be a dict or a JSON object, not %s" % (what, type(parameters).__name__)
        )
    for k, v in parameters.items():
        if not isinstance(k, str):
            raise TritonModelException("%s parameter keys must be strings, got %r" % (what, k))
        if not isinstance(v, (str, int, bool)):
            raise TritonModelException(
                "%s parameter %r must be a string, an integer or a boolean, not %s"
                % (what, k, type(v).__name__)
            )
    return parameters


# --------------------------------------------------------------- responses


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None, parameters=None):
        if output_tensors is None:
            output_tensors = []
        elif not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException("output_tensors must be a list of pb_utils.Tensor")
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = _check_parameters(parameters, "response")

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return json.dumps(self._parameters)

    def _to_wire(self, rt, requested=None):
        """The protocol's response object; the outputs are copied into the
        stub pool. A response that cannot be sent becomes an error response."""
        outputs = []
        try:
            if self._error is None:
                for t in self._outputs:
                    if not isinstance(t, Tensor):
                        raise TritonModelException(
                            "output_tensors must hold pb_utils.Tensor objects, not %s"
                            % type(t).__name__
                        )
                    if requested and t._name not in requested:
                        continue
                    outputs.append(_tensor_to_wire(rt, t))
            return {
                "outputs": outputs,
                "error": None if self._error is None else self._error._to_wire(),
                "parameters": self._parameters,
            }
        except Exception as e:
            for d in outputs:
                if d["seg"] >= 0:
                    rt.stub_pool.release(d["seg"], d["off"])
            return {
                "outputs": [],
                "error": {"message": "%s: %s" % (type(e).__name__, e), "code": "INTERNAL"},
                "parameters": {},
            }

    @classmethod
    def _from_wire(cls, rt, r):
        error = r.get("error")
        descs = r.get("outputs") or []
        if error is not None:
            for d in descs:
                _rt.free_host_block(rt.host_pool, d)
            return cls([], _error_from_wire(error), r.get("parameters") or None)
        outputs = []
        try:
            for i, d in enumerate(descs):
                outputs.append(_tensor_from_wire(rt, d))
        except Exception as e:
            for d in descs[i + 1 :]:
                _rt.free_host_block(rt.host_pool, d)
            return cls([], TritonError("bad BLS response: %s" % e))
        resp = cls.__new__(cls)
        resp._outputs = outputs
        resp._error = None
        params = r.get("parameters")
        resp._parameters = params if isinstance(params, dict) else {}
        return resp


class InferenceResponseSender:
    """A request's response sender (decoupled models, and the one-response
    use of non-decoupled models). It holds no reference to its request, so
    the request's inputs go as soon as the model drops the request."""

    def __init__(self, execution, index, state, request_id):
        self._execution = execution
        self._index = index
        self._state = state
        self._request_id = request_id
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                "send takes a pb_utils.InferenceResponse, not %s" % type(response).__name__
            )
        if response is None and not final:
            raise TritonModelException(
                "send needs a response unless flags is TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "request %r already sent its final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL)"
                    % self._request_id
                )
            if final:
                self._closed = True
            self._execution.sender_send(self._index, response, final)

    def is_cancelled(self):
        return _is_cancelled(self._state, self._index)


def _is_cancelled(state, index):
    if state is None:
        return False
    if not state.cancelled[index]:
        rt = _rt.RUNTIME
        if rt is not None:
            rt.channel.poll()
    return state.cancelled[index]


# --------------------------------------------------------------- requests


class InferenceRequest:
    """A request given to execute, or one made for a BLS call."""

    def __init__(
        self,
        model_name=None,
        inputs=None,
        requested_output_names=None,
        request_id="",
        correlation_id=0,
        trace=None,
        flags=0,
        timeout=0,
        preferred_memory=None,
        model_version=-1,
        parameters=None,
        **_ignored
    ):
        if not model_name:
            raise TritonModelException("InferenceRequest needs a model_name")
        # Triton's binding takes bytes for a str (models pass a BYTES
        # input's element straight through).
        self._model_name = _text(model_name)
        self._model_version = int(model_version)
        self._inputs = list(inputs or [])
        for t in self._inputs:
            if not isinstance(t, Tensor):
                raise TritonModelException("InferenceRequest inputs must be pb_utils.Tensor objects")
        self._requested = [str(n) for n in (requested_output_names or [])]
        self._id = _text(request_id or "")
        self._correlation_id = correlation_id if isinstance(correlation_id, str) else int(correlation_id)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._parameters = _check_parameters(parameters, "request")
        self._execution = None
        self._index = -1
        self._state = None
        self._sender = None

    @classmethod
    def _received(cls, execution, index, state, r, inputs):
        req = cls.__new__(cls)
        req._model_name = ""
        req._model_version = -1
        req._inputs = inputs
        req._requested = r.get("requested_outputs") or []
        req._id = r.get("id") or ""
        req._correlation_id = r.get("correlation_id", 0)
        req._flags = r.get("flags", 0) or 0
        req._timeout = r.get("timeout_us", 0) or 0
        req._parameters = r.get("parameters") or {}
        req._execution = execution
        req._index = index
        req._state = state
        req._sender = None
        return req

    def inputs(self):
        return self._inputs

    def requested_output_names(self):
        return self._requested

    def request_id(self):
        return self._id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def timeout(self):
        return self._timeout

    def model_name(self):
        return self._model_name

    def model_version(self):
        return self._model_version

    def parameters(self):
        return json.dumps(self._parameters)

    def is_cancelled(self):
        return _is_cancelled(self._state, self._index)

    def get_response_sender(self):
        if self._execution is None:
            raise TritonModelException("only a request given to execute has a response sender")
        if self._sender is None:
            self._sender = InferenceResponseSender(self._execution, self._index, self._state, self._id)
        return self._sender

    # -- BLS

    def _bls_message(self, rt, decoupled):
        inputs = []
        try:
            for t in self._inputs:
                inputs.append(_tensor_to_wire(rt, t))
        except BaseException:
            for d in inputs:
                if d["seg"] >= 0:
                    rt.stub_pool.release(d["seg"], d["off"])
            raise
        return {
            "op": "bls",
            "call": 0,
            "model": self._model_name,
            "version": self._model_version,
            "inputs": inputs,
            "requested_outputs": self._requested,
            "request_id": self._id,
            "correlation_id": self._correlation_id,
            "flags": self._flags,
            "timeout_us": self._timeout,
            "parameters": self._parameters,
            "decoupled": bool(decoupled),
        }

    def _start(self, decoupled, loop=None, future=None):
        """(runtime, Call, None), or (None, None, an error response)."""
        try:
            rt = _runtime()
            msg = self._bls_message(rt, decoupled)
            try:
                return rt, rt.start_call(msg, loop, future), None
            except BaseException:
                for d in msg["inputs"]:
                    if d["seg"] >= 0:
                        rt.stub_pool.release(d["seg"], d["off"])
                raise
        except Exception as e:
            return None, None, InferenceResponse(
                error=TritonError("BLS request to %r failed: %s" % (self._model_name, e))
            )

    def exec(self, decoupled=False):
        rt, call, error = self._start(decoupled)
        if error is not None:
            return iter([error]) if decoupled else error
        if decoupled:
            return _ResponseIterator(rt, call, self._model_name)
        rt.wait_call(call)
        return _single(rt, call, self._model_name)

    async def async_exec(self, decoupled=False):
        import asyncio

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        rt, call, error = self._start(decoupled, loop, future)
        if error is not None:
            return iter([error]) if decoupled else error
        await future
        if decoupled:
            return iter(_all(rt, call, self._model_name))
        return _single(rt, call, self._model_name)


def _lost(model):
    return InferenceResponse(
        error=TritonError("BLS request to %r failed: the server closed the stub's socket" % model, TritonError.UNAVAILABLE)
    )


def _single(rt, call, model):
    items = list(call.items)
    call.items.clear()
    if not items:
        if call.lost:
            return _lost(model)
        return InferenceResponse(error=TritonError("BLS request to %r got no response" % model))
    first = InferenceResponse._from_wire(rt, items[0])
    for extra in items[1:]:
        for d in extra.get("outputs") or ():
            _rt.free_host_block(rt.host_pool, d)
    return first


def _all(rt, call, model):
    items = list(call.items)
    call.items.clear()
    out = [InferenceResponse._from_wire(rt, r) for r in items]
    if call.lost and not out:
        out.append(_lost(model))
    return out


class _ResponseIterator:
    """The responses of a decoupled BLS call, as they come."""

    def __init__(self, rt, call, model):
        self._rt = rt
        self._call = call
        self._model = model
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item, final = self._rt.next_item(self._call)
        if item is not None:
            return InferenceResponse._from_wire(self._rt, item)
        self._done = True
        if self._call.lost:
            return _lost(self._model)
        raise StopIteration

    def cancel(self):
        pass


# --------------------------------------------------------------- helpers


def get_input_tensor_by_name(inference_request, name):
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response, name):
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def _config_dict(model_config):
    if isinstance(model_config, ModelConfig):
        return model_config.as_dict()
    if isinstance(model_config, str):
        return json.loads(model_config)
    return model_config


def get_input_config_by_name(model_config, name):
    for c in _config_dict(model_config).get("input") or ():
        if c.get("name") == name:
            return c
    return None


def get_output_config_by_name(model_config, name):
    for c in _config_dict(model_config).get("output") or ():
        if c.get("name") == name:
            return c
    return None


def using_decoupled_model_transaction_policy(model_config):
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


_NUMPY_TYPES = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def triton_to_numpy_type(data_type):
    """numpy type of a Triton data-type number (TYPE_FP32 = 11 ...)."""
    return _NUMPY_TYPES.get(data_type)


def numpy_to_triton_type(data_type):
    """Triton data-type number of a numpy type, or None."""
    name = _rt.datatype_of(np.dtype(data_type))
    return _TYPE_NUMBERS.get(name) if name else None


def triton_string_to_numpy(triton_type_string):
    """numpy type of a config data type: "TYPE_FP32" -> np.float32."""
    s = str(triton_type_string)
    if s.startswith("TYPE_"):
        s = s[5:]
    if s == "STRING":
        s = "BYTES"
    return _NUMPY_TYPES.get(_TYPE_NUMBERS.get(s))


def serialize_byte_tensor(input_tensor):
    """Triton's BYTES serialization of an array, as a uint8 array."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=np.uint8)
    return np.frombuffer(_rt.serialize_bytes(np.asarray(input_tensor)), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor):
    """An object array of the elements of Triton's BYTES serialization."""
    data = bytes(np.asarray(encoded_tensor).tobytes()) if not isinstance(encoded_tensor, bytes) else encoded_tensor
    out = []
    pos = 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos : pos + 4], "little")
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return np.array(out, dtype=np.object_)


# --------------------------------------------------------------- logging


class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVEL_NAMES = {0: "INFO", 1: "WARNING", 2: "ERROR", 3: "VERBOSE"}


def _send_log(level, message, depth):
    try:
        frame = sys._getframe(depth)
        filename, line = frame.f_code.co_filename, frame.f_lineno
    except ValueError:
        filename, line = "", 0
    rt = _rt.RUNTIME
    msg = {"op": "log", "level": level, "message": str(message), "file": filename, "line": line}
    if rt is None:
        print("%s %s:%d] %s" % (level[0], filename, line, message), file=sys.stderr)
        return
    rt.channel.send(msg)


class Logger:
    @staticmethod
    def log(message, level=LogLevel.INFO):
        _send_log(_LEVEL_NAMES.get(level, "INFO"), message, 2)

    @staticmethod
    def log_info(message):
        _send_log("INFO", message, 2)

    @staticmethod
    def log_warn(message):
        _send_log("WARNING", message, 2)

    @staticmethod
    def log_error(message):
        _send_log("ERROR", message, 2)

    @staticmethod
    def log_verbose(message):
        _send_log("VERBOSE", message, 2)


# --------------------------------------------------------------- metrics


class Metric:
    def __init__(self, family, labels=None, buckets=None):
        if not isinstance(family, MetricFamily):
            raise TritonModelException("a Metric comes from MetricFamily.Metric(labels, buckets)")
        labels = dict(labels or {})
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TritonModelException("metric labels must map strings to strings")
        kind = family._kind
        if kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("a histogram metric needs buckets")
            buckets = [float(b) for b in buckets]
        elif buckets is not None:
            raise TritonModelException("only a histogram metric takes buckets")
        self._family = family
        self._kind = kind
        self._value = 0.0
        self._lock = threading.Lock()
        self._id = _runtime().new_id()
        _runtime().channel.send(
            {"op": "metric", "family": family._id, "metric": self._id, "labels": labels, "buckets": buckets}
        )

    def _update(self, action, value):
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise TritonModelException("metric values must be finite numbers, got %r" % value)
        _runtime().channel.send({"op": "metric_update", "metric": self._id, "action": action, "value": value})
        return value

    def increment(self, value):
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("increment is for counters and gauges, not histograms")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be incremented by a negative value")
        with self._lock:
            self._value += self._update("increment", value)

    def set(self, value):
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("set is for gauges only")
        with self._lock:
            self._value = self._update("set", value)

    def observe(self, value):
        if self._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe is for histograms only")
        self._update("observe", value)

    def value(self):
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("value is for counters and gauges, not histograms")
        return self._value


class MetricFamily:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {0: "COUNTER", 1: "GAUGE", 2: "HISTOGRAM"}

    def __init__(self, name, description, kind):
        if isinstance(kind, str):
            names = {v: k for k, v in self._KINDS.items()}
            if kind.upper() not in names:
                raise TritonModelException("unknown metric kind %r" % kind)
            kind = names[kind.upper()]
        if kind not in self._KINDS:
            raise TritonModelException("unknown metric kind %r" % kind)
        self._name = str(name)
        self._description = str(description)
        self._kind = kind
        rt = _runtime()
        self._id = rt.new_id()
        rt.channel.send(
            {
                "op": "metric_family",
                "family": self._id,
                "name": self._name,
                "description": self._description,
                "kind": self._KINDS[kind],
            }
        )

    def Metric(self, labels=None, buckets=None):
        return Metric(self, labels, buckets)


# ------------------------------------------------------- auto-complete config


class ModelConfig:
    """The config given to TritonPythonModel.auto_complete_config."""

    def __init__(self, model_config):
        if isinstance(model_config, str):
            model_config = json.loads(model_config)
        self._config = model_config if model_config is not None else {}

    def as_dict(self):
        return self._config

    def max_batch_size(self):
        return int(self._config.get("max_batch_size") or 0)

    def set_max_batch_size(self, max_batch_size):
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise ValueError("set_max_batch_size: max_batch_size must be an integer >= 0, got %r" % (max_batch_size,))
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        if self._config.get("sequence_batching"):
            raise ValueError("set_dynamic_batching: the model config already has sequence_batching")
        if not self._config.get("dynamic_batching"):
            self._config["dynamic_batching"] = {}

    def set_model_transaction_policy(self, transaction_policy_dict):
        if not isinstance(transaction_policy_dict, dict):
            raise ValueError("set_model_transaction_policy takes a dict like {'decoupled': True}")
        for k, v in transaction_policy_dict.items():
            if k != "decoupled":
                raise ValueError("set_model_transaction_policy: unknown key %r (only 'decoupled')" % k)
            if not isinstance(v, bool):
                raise ValueError("set_model_transaction_policy: 'decoupled' must be a bool")
        policy = self._config.get("model_transaction_policy") or {}
        policy.update(transaction_policy_dict)
        self._config["model_transaction_policy"] = policy

    def _add(self, kind, tensor):
        what = "add_" + kind
        if not isinstance(tensor, dict):
            raise ValueError("%s takes a dict with 'name', 'data_type' and 'dims'" % what)
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError("%s: the %s has no %r" % (what, kind, key))
        tensor = dict(tensor)
        data_type = str(tensor["data_type"])
        if not data_type.startswith("TYPE_"):
            data_type = "TYPE_" + ("STRING" if data_type == "BYTES" else data_type)
        if data_type != "TYPE_STRING" and data_type[5:] not in _TYPE_NUMBERS:
            raise ValueError("%s: %r has an unknown data_type %r" % (what, tensor["name"], tensor["data_type"]))
        tensor["data_type"] = data_type
        tensor["dims"] = [int(d) for d in tensor["dims"]]
        existing = self._config.get(kind)
        if existing is None:
            existing = self._config[kind] = []
        for t in existing:
            if t.get("name") == tensor["name"]:
                raise ValueError(
                    "%s: the model config already has an %s named %r" % (what, kind, tensor["name"])
                )
        existing.append(tensor)

    def add_input(self, input):
        self._add("input", input)

    def add_output(self, output):
        self._add("output", output)


def _text(value):
    """A str from a str or UTF-8 bytes, as Triton's bindings convert them."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    return str(value)
