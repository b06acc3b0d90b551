"""What upstream LMCache 0.5.6 needs of its platform that Debian 12 lacks,
supplied before `lmcache` is imported (tests/upstream/README.md).

lmcache 0.5.6 is built for torch >= 2.1 and a GCC 13 libstdc++; Debian 12
has torch 1.13 and GCC 12.  The fills are narrow, each applied only where
the platform lacks the thing, so on a newer platform nothing is changed:

* `cxx_compat.c` (built by CMake as libupstream_cxx_compat.so), loaded
  RTLD_GLOBAL, defines the one GCC 13 std::string helper that upstream's
  compiled `lmcache_native` module calls;
* `torch.Tensor.untyped_storage()` (torch 2.0): the tensor's untyped
  storage.  torch 2 keeps one Python object per storage, and upstream's
  CPU shared-memory wrapper ties the segment's lifetime to that object,
  so the fill hands out one object per storage as well;
* `torch.dtype.itemsize` (torch 2.1) cannot be added to torch's C type, so
  the table of dtypes in upstream's IPC descriptor module, the one place
  on the paths these tests run that reads it, maps each name to the dtype
  with its item size attached.

Anything else upstream needs from torch 2 stays missing, and the tests do
not run the code that needs it (tests/upstream/README.md lists what runs).
"""
import ctypes
import os

FILLED = []


def _load_cxx_compat():
    path = os.environ.get("LMC_UPSTREAM_CXX_COMPAT")
    if not path or not os.path.exists(path):
        raise RuntimeError("LMC_UPSTREAM_CXX_COMPAT does not name the built "
                           "libupstream_cxx_compat.so (ctest sets it)")
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    FILLED.append("libstdc++ _M_replace_cold")
    return path


class _DtypeWithItemsize:
    """A torch dtype as upstream's descriptor table holds it, plus the
    item size torch 1.13's dtype does not carry."""

    def __init__(self, dtype, torch):
        self.dtype = dtype
        self.itemsize = torch.tensor([], dtype=dtype).element_size()

    def __eq__(self, other):
        return other is self or other == self.dtype

    def __hash__(self):
        return hash(self.dtype)


def _fill_torch(torch):
    if not hasattr(torch.Tensor, "untyped_storage"):
        storages = {}

        def untyped_storage(self):
            s = self.storage().untyped()
            return storages.setdefault((s.data_ptr(), s.nbytes()), s)

        torch.Tensor.untyped_storage = untyped_storage
        FILLED.append("torch.Tensor.untyped_storage")
    if hasattr(torch.float16, "itemsize"):
        return
    import lmcache.v1.platform.base.ipc_wire as ipc_wire
    for name, dtype in list(ipc_wire.DTYPES.items()):
        ipc_wire.DTYPES[name] = _DtypeWithItemsize(dtype, torch)
    FILLED.append("lmcache ipc_wire.DTYPES itemsize")


def prepare():
    """Loads the fills; returns the compat library's path."""
    path = _load_cxx_compat()
    import torch
    _fill_torch(torch)
    return path
