"""An engine's paged KV cache in CPU shared memory, as a server-driven
client builds it (docs/protocol.md, "Server-driven KV formats"): one POSIX
shared-memory segment per registered tensor, filled with random bytes, the
CpuShmTensorWrapper pickles that REGISTER_KV_CACHE carries, and the byte
rows of one (K/V, layer, block, slot, head) for comparing what STORE read
and RETRIEVE wrote.  No torch: shapes, strides and offsets are computed
here from each format's own dimension order."""
import atexit
import mmap
import os
import sys

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pickles"))
import descriptors  # noqa: E402
import wrappers as w  # noqa: E402

ITEM = {"float16": 2, "bfloat16": 2, "float32": 4, "uint8": 1}

# Physical dimension order per format: which index goes where.  "l" only
# appears in the cross-layer tensor; per-layer formats get one tensor each.
FORMATS = {
    "fa_nhd": ("kv", "b", "s", "h", "e"),        # [2, NB, BS, NH, HS]
    "fa_hnd": ("kv", "b", "h", "s", "e"),        # [2, NB, NH, BS, HS]
    "fi_nhd": ("b", "kv", "s", "h", "e"),        # [NB, 2, BS, NH, HS]
    "fi_hnd": ("b", "kv", "h", "s", "e"),        # [NB, 2, NH, BS, HS]
    "mla": ("b", "s", "e"),                      # [NB, BS, HS]
    "fused_nhd": ("b", "s", "h", "e"),           # [NB, BS, NH, 2*HS]
    "fused_hnd": ("b", "h", "s", "e"),           # [NB, NH, BS, 2*HS]
    "cross": ("b", "l", "kv", "s", "h", "e"),    # [NB, NL, 2, BS, NH, HS]
    "trt6": ("b", "l", "kv", "h", "s", "e"),     # TRT-LLM [NB, NL, 2, NH, BS, HS]
}
# Every segment this process created and has not unlinked.  A test that
# failed before close() used to leave its segments in /dev/shm (270 MB for
# test_a_worker_gone_mid_store_still_lands_its_store); conftest.py unlinks
# what is left after each test and fails a test that passed but left any,
# and atexit catches users without that fixture.
_created = set()


def create_segment(name, nbytes):
    """A new POSIX shared-memory segment /dev/shm<name> of nbytes, mapped;
    unlinked by unlink_segment(), or by unlink_leftovers() at the latest."""
    fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    _created.add(name)
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def unlink_segment(name):
    _created.discard(name)
    try:
        os.unlink("/dev/shm" + name)
    except FileNotFoundError:
        pass


def unlink_leftovers():
    """Unlinks every segment this process created and did not unlink yet;
    returns the names of those that were still there."""
    left = sorted(n for n in _created if os.path.exists("/dev/shm" + n))
    for name in list(_created):
        unlink_segment(name)
    return left


atexit.register(unlink_leftovers)

# Formats whose registered tensors fold dimensions: SGLang's K tensors then
# V tensors [NB*BS, NH, HS], its MLA [NB*BS, 1, HS], TRT-LLM's pool
# [NB, NL, 2, NH*BS*HS].
FOLDED = ("sglang_kv", "sglang_mla", "trt4")


class Tensor:
    """One segment holding one tensor; `pad` widens MLA rows (dim-0 stride)."""

    def __init__(self, name, shape, dtype, pad=0):
        self.name, self.shape, self.dtype = name, list(shape), dtype
        self.item = ITEM[dtype]
        stride, acc = [], 1
        for s in reversed(shape):
            stride.insert(0, acc)
            acc *= s
        if pad:
            stride[0] += pad
        self.stride = stride
        self.nbytes = stride[0] * shape[0] * self.item
        self.mm = create_segment(name, self.nbytes)
        self.mm[:] = os.urandom(self.nbytes)

    def wrapper(self):
        return w.cpu_shm(self.name, self.shape, stride=self.stride, dtype=self.dtype,
                         nbytes=self.nbytes)

    def descriptor(self):
        """The handle as lmcache 0.5.6 and later send it (msgpack)."""
        return descriptors.cpu_shm(self.name, self.shape, dtype=self.dtype, itemsize=self.item,
                                   stride=self.stride, nbytes=self.nbytes)

    def offset(self, idx):
        return sum(i * s for i, s in zip(idx, self.stride)) * self.item

    def close(self, unlink=True):
        self.mm.close()
        if unlink:
            unlink_segment(self.name)


class PagedKV:
    """The KV tensors of one engine group: NL layers of `fmt`."""

    def __init__(self, tag, fmt, nl, nb, bs, nh, hs, dtype="float16", pad=0):
        self.fmt, self.nl, self.nb, self.bs, self.nh, self.hs = fmt, nl, nb, bs, nh, hs
        self.dtype, self.item = dtype, ITEM[dtype]
        dims = {"kv": 2, "b": nb, "s": bs, "h": nh, "e": hs, "l": nl}
        if fmt == "mla":
            self.nh = nh = 1
        if fmt.startswith("fused"):
            dims["e"] = 2 * hs
        if fmt == "sglang_mla":
            self.nh = nh = 1
        self.order = FORMATS.get(fmt)
        shape = {"sglang_kv": [nb * bs, nh, hs], "sglang_mla": [nb * bs, 1, hs],
                 "trt4": [nb, nl, 2, nh * bs * hs]}.get(fmt) or [dims[d] for d in self.order]
        pid = os.getpid()
        n_tensors = (1 if self.cross else 2 * nl if fmt == "sglang_kv" else nl)
        self.tensors = [Tensor(f"/lmcache_kv_{pid}_{tag}_{i}", shape, dtype, pad)
                        for i in range(n_tensors)]

    @property
    def cross(self):
        return self.fmt in ("cross", "trt6", "trt4")

    @property
    def kv_size(self):
        return 1 if self.fmt in ("mla", "sglang_mla") or self.fmt.startswith("fused") else 2

    @property
    def row_elems(self):
        """Elements per (slot, head) row as the object stores it."""
        return 2 * self.hs if self.fmt.startswith("fused") else self.hs

    def handles(self, descriptor=False):
        return [msgpack.ExtType(1, t.descriptor() if descriptor else w.dumps(t.wrapper()))
                for t in self.tensors]

    def row(self, kv, l, b, s, h):
        """The bytes of one head's row."""
        if self.fmt == "sglang_kv":
            t, idx = self.tensors[kv * self.nl + l], [b * self.bs + s, h, 0]
        elif self.fmt == "sglang_mla":
            t, idx = self.tensors[l], [b * self.bs + s, 0, 0]
        elif self.fmt == "trt4":
            t, idx = self.tensors[0], [b, l, kv, (h * self.bs + s) * self.hs]
        else:
            t = self.tensors[0 if self.cross else l]
            where = {"kv": kv, "b": b, "s": s, "h": h, "e": 0, "l": l}
            idx = [where[d] for d in self.order]
        off = t.offset(idx)
        return bytes(t.mm[off:off + self.row_elems * self.item])

    def rows(self, blocks, tokens):
        """Every row of `tokens` tokens laid over `blocks`, in object order
        ([kv, layer, slot, head]): the chunk objects' bytes, concatenated
        per chunk when the blocks cover whole chunks of one group."""
        out = []
        for kv in range(self.kv_size):
            for l in range(self.nl):
                for t in range(tokens):
                    for h in range(self.nh):
                        out.append(self.row(kv, l, blocks[t // self.bs], t % self.bs, h))
        return out

    def block_bytes(self, b):
        """Every byte of block b, all layers (to see what a copy touched)."""
        return [self.row(kv, l, b, s, h) for kv in range(self.kv_size)
                for l in range(self.nl) for s in range(self.bs) for h in range(self.nh)]

    def close(self, unlink=True):
        for t in self.tensors:
            t.close(unlink)
