"""The data-only tensor descriptors that lmcache 0.5.6 and later send in
REGISTER_KV_CACHE instead of pickles (docs/protocol.md, "Shared tensor
handles"), built with Debian's msgpack from the facts of their encoding:
one msgpack map per handle, its keys in this order, the tag first and the
keyword-only fields of the common base last:

    type      "cuda" | "cuda_raw" | "cuda_vmm" | "cpu_shm"
    ...       the fields of the type
    version   1
    metadata  {dtype, shape, stride, storage_offset, device_uuid}

tests/upstream/test_upstream_partner.py checks these bytes against what
upstream's own encoder writes for the same tensor."""
import msgpack


def _meta(shape, stride, dtype, storage_offset, device_uuid):
    return {"dtype": dtype, "shape": list(shape), "stride": list(stride),
            "storage_offset": storage_offset, "device_uuid": device_uuid}


def _contiguous(shape):
    stride, step = [], 1
    for n in reversed(shape):
        stride.insert(0, step)
        step *= n
    return stride


def encode(tag, metadata, **fields):
    return msgpack.packb({"type": tag, **fields, "version": 1, "metadata": metadata},
                         use_bin_type=True)


def cpu_shm(shm_name, shape, dtype="float16", itemsize=2, stride=None, storage_offset=0,
            nbytes=None):
    stride = stride or _contiguous(shape)
    if nbytes is None:
        nbytes = itemsize
        for n in shape:
            nbytes *= n
    return encode("cpu_shm", _meta(shape, stride, dtype, storage_offset, "cpu"),
                  shm_name=shm_name, nbytes=nbytes)


def cuda(shape, stride, storage_bytes, dtype="bfloat16", storage_offset=0, offset_bytes=0,
         uuid="8a3c0b7e-1f2d-4c5b-9e6a-0123456789ab", event=True):
    handle = [0, bytes([2, ord("c")]) + bytes(range(64)), storage_bytes, offset_bytes,
              b"/torch_4242_1234567890_0", 3, bytes(range(64, 128)), event]
    return encode("cuda", _meta(shape, stride, dtype, storage_offset, uuid), handle=handle)


def cuda_raw(shape, stride, nbytes, alloc_offset, dtype="float16",
             uuid="8a3c0b7e-1f2d-4c5b-9e6a-0123456789ab"):
    return encode("cuda_raw", _meta(shape, stride, dtype, 0, uuid),
                  ipc_handle=bytes(range(64)), alloc_offset=alloc_offset, nbytes=nbytes)
