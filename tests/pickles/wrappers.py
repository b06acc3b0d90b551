"""Stand-ins for upstream's tensor wrapper classes and torch dtypes, so that
Python's own pickle writes the same bytes an engine's LMCache adapter sends
in REGISTER_KV_CACHE (docs/protocol.md, "Shared tensor handles"), without
torch or LMCache installed.  A class keeps its upstream module and name and
sets its attributes in upstream's order; a dtype pickles as the global
torch.<name>."""
import pickle
import sys
import types

CUDA_MODULE = "lmcache.v1.platform.cuda.ipc_wrapper"
CPU_MODULE = "lmcache.v1.platform.cpu.shm"


def _module(name):
    """The module, and its parent packages, as pickle's import finds them."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


class _Dtype:
    """torch.dtype reduces to its attribute name in module torch."""

    def __init__(self, name):
        self.name = name
        self.__module__ = "torch"

    def __reduce__(self):
        return self.name


DTYPES = {}
for _name in ("float16", "bfloat16", "float32", "float64", "uint8", "int8", "float8_e4m3fn",
              "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "int32", "int64"):
    DTYPES[_name] = _Dtype(_name)
    setattr(_module("torch"), _name, DTYPES[_name])


def _wrapper_class(module, name):
    mod = _module(module)
    if not hasattr(mod, name):
        cls = type(name, (), {"__module__": module})
        cls.__qualname__ = name
        setattr(mod, name, cls)
    return getattr(mod, name)


def _new(module, name, fields):
    cls = _wrapper_class(module, name)
    obj = cls.__new__(cls)
    for k, v in fields:            # __dict__ in upstream's assignment order
        setattr(obj, k, v)
    return obj


def cuda_ipc(shape, stride, dtype="bfloat16", storage_bytes=None, offset_bytes=0,
             mem_handle=None, version=2, kind=b"c", storage_offset=0, event_sync=True,
             uuid="8a3c0b7e-1f2d-4c5b-9e6a-0123456789ab", module=CUDA_MODULE):
    itemsize = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4,
                "int64": 8}.get(dtype, 1)
    extent = storage_offset + sum((s - 1) * st for s, st in zip(shape, stride)) + 1
    if storage_bytes is None:
        storage_bytes = extent * itemsize
    raw = mem_handle if mem_handle is not None else bytes(range(64))
    handle_bytes = raw if version is None else bytes([version]) + kind + raw
    handle = (0, handle_bytes, storage_bytes, offset_bytes, b"/torch_4242_1234567890_0", 3,
              bytes(range(64, 128)) if event_sync else bytes(64), event_sync)
    return _new(module, "CudaIPCWrapper", [
        ("handle", handle), ("dtype", DTYPES[dtype]), ("shape", tuple(shape)),
        ("stride", tuple(stride)), ("storage_offset", storage_offset), ("device_uuid", uuid)])


def raw_cuda_ipc(shape, stride, dtype="float16", alloc_offset=4096,
                 uuid="8a3c0b7e-1f2d-4c5b-9e6a-0123456789ab", module=CUDA_MODULE,
                 mem_handle=None):
    nbytes = 1
    for s in shape:
        nbytes *= s
    nbytes *= 2 if dtype in ("float16", "bfloat16") else 1
    return _new(module, "RawCudaIPCWrapper", [
        ("_ipc_handle_reserved", mem_handle if mem_handle is not None else bytes(range(64))),
        ("_alloc_offset", alloc_offset),
        ("_nbytes", nbytes), ("handle", None), ("dtype", DTYPES[dtype]),
        ("shape", tuple(shape)), ("stride", tuple(stride)), ("storage_offset", 0),
        ("_opens", 0), ("device_uuid", uuid)])


def cpu_shm(shm_name, shape, stride=None, dtype="float16", nbytes=None, module=CPU_MODULE):
    if stride is None:
        stride, acc = [], 1
        for s in reversed(shape):
            stride.insert(0, acc)
            acc *= s
    itemsize = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4,
                "int64": 8}.get(dtype, 1)
    if nbytes is None:
        nbytes = itemsize
        for s in shape:
            nbytes *= s
    return _new(module, "CpuShmTensorWrapper", [
        ("shm_name", shm_name), ("nbytes", nbytes), ("handle", None),
        ("dtype", DTYPES[dtype]), ("shape", tuple(shape)), ("stride", tuple(stride)),
        ("storage_offset", 0), ("device_uuid", "cpu")])


def dumps(obj, protocol=4):
    return pickle.dumps(obj, protocol=protocol)
