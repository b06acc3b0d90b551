#!/usr/bin/env python3
"""Writes tests/unit/kv/pickle_vectors.h: tensor-wrapper pickles made by
Python's own pickle from the stand-ins in wrappers.py (byte-identical to
what an engine sends), the msgpack descriptors of lmcache 0.5.6 and later
(descriptors.py), and hostile ones of both, as C arrays for
tests/unit/kv/test_shared_tensor.c.  --check only compares (the ctest
pickle_vectors_current runs it, so the header cannot drift from this
script).  Deterministic."""
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import descriptors as d  # noqa: E402
import wrappers as w  # noqa: E402

OUT = os.path.join(HERE, "..", "unit", "kv", "pickle_vectors.h")
BF16_SHAPE, BF16_STRIDE = [2, 1000, 16, 8, 128], [16384000, 16384, 1024, 128, 1]


PWNED = "/tmp/lmcached-pickle-was-run"


class _Evil:
    """What an attacker would send: REDUCE of os.system, leaving a file
    behind if it ever runs."""

    def __reduce__(self):
        import os as _os
        return (_os.system, ("touch " + PWNED,))


def _nested(depth):
    v = 1
    for _ in range(depth):
        v = (v,)
    return v


def vectors():
    small = w.cuda_ipc([2, 4, 16, 2, 8], [1024, 256, 16, 8, 1], dtype="float16")
    good = {
        # The annotated example of upstream's CudaIPCWrapper (bf16, 2 GiB storage).
        "cuda_ipc_v2": w.dumps(w.cuda_ipc(BF16_SHAPE, BF16_STRIDE, storage_bytes=2**31)),
        "cuda_ipc_raw64_old_module": w.dumps(w.cuda_ipc(
            [2, 64, 16, 8, 128], [131072, 2048, 128, 16, 1], dtype="float16", version=None,
            event_sync=False, module="lmcache.v1.multiprocess.custom_types")),
        "cuda_ipc_v3_protocol5": w.dumps(w.cuda_ipc(
            [1000, 2, 16, 8, 128], [32768, 16384, 1024, 128, 1], version=3,
            storage_offset=512, offset_bytes=1 << 20), protocol=5),
        "raw_cuda_ipc": w.dumps(w.raw_cuda_ipc([64, 2, 16, 8, 64], [16384, 8192, 512, 64, 1])),
        "cpu_shm": w.dumps(w.cpu_shm("/lmcache_kv_4242_0", [2, 4, 16, 2, 8])),
        "cpu_shm_fp8_backends": w.dumps(w.cpu_shm(
            "/lmcache_kv_1_7", [4, 2, 16, 128], dtype="float8_e4m3fn",
            module="lmcache.v1.platform.backends.cpu.shm")),
        "cuda_ipc_small": w.dumps(small),
    }
    empty = w.cuda_ipc([2, 4, 16, 2, 8], [1024, 256, 16, 8, 1], dtype="float16")
    empty.handle = (0, None, 0, 0, None, 0, None, None)
    vmm = w._new(w.CUDA_MODULE, "VmmCudaIPCWrapper", [("handle", b"x" * 16)])
    other = w._new(w.CUDA_MODULE, "NotAWrapper", [("dtype", w.DTYPES["float16"])])
    cpu = w.dumps(w.cpu_shm("/lmcache_kv_1_1", [2, 16, 8]))
    bad = {
        "expandable_segment": w.dumps(w.cuda_ipc([2, 4, 16, 2, 8], [1024, 256, 16, 8, 1],
                                                 kind=b"e")),
        "empty_storage": w.dumps(empty),
        "vmm": w.dumps(vmm),
        "unknown_class": w.dumps(other),
        "reduce_os_system": pickle.dumps(_Evil(), protocol=4),
        "global_builtins_eval": pickle.dumps(eval, protocol=4),
        "past_its_storage": w.dumps(w.cuda_ipc([2, 4, 16, 2, 8], [1024, 256, 16, 8, 1],
                                               dtype="float16", storage_bytes=4095)),
        "complex_dtype": cpu.replace(b"float16", b"complex"),
        "shm_name_no_slash": w.dumps(w.cpu_shm("lmcache_kv", [2, 16, 8])),
        "trailing_bytes": cpu + b"N",
        "truncated": cpu[: len(cpu) - 40],
        "deep_nesting": pickle.dumps(_nested(40), protocol=4),
        "frame_past_end": cpu[:3] + (10**6).to_bytes(8, "little") + cpu[11:],
        "protocol_0": pickle.dumps({"a": 1}, protocol=0),
    }
    good.update(descriptor_vectors())
    bad.update(bad_descriptor_vectors())
    return good, bad


def descriptor_vectors():
    return {
        "desc_cpu_shm": d.cpu_shm("/lmcache_kv_4242_0", [2, 4, 16, 2, 8]),
        # A view 40 elements into a segment of its storage's size.
        "desc_cpu_shm_view": d.cpu_shm("/lmcache_kv_4242_1", [2, 4, 16, 2, 8],
                                       storage_offset=40, nbytes=2 * 4 * 16 * 2 * 8 * 2 + 80),
        "desc_cuda": d.cuda(BF16_SHAPE, BF16_STRIDE, 2**31),
        "desc_cuda_raw": d.cuda_raw([64, 2, 16, 8, 64], [16384, 8192, 512, 64, 1],
                                    64 * 2 * 16 * 8 * 64 * 2, 4096),
    }


def bad_descriptor_vectors():
    meta = {"dtype": "float16", "shape": [2, 16, 8], "stride": [128, 8, 1],
            "storage_offset": 0, "device_uuid": "cpu"}
    shm = {"shm_name": "/lmcache_kv_1_1", "nbytes": 512}

    def enc(**fields):
        return d.msgpack.packb(fields, use_bin_type=True)

    return {
        "desc_version_2": enc(type="cpu_shm", version=2, metadata=meta, **shm),
        "desc_vmm": enc(type="cuda_vmm", version=1, metadata=meta, export_id=b"x" * 16,
                        kind="posix_fd", fabric_blob=None, alloc_size=512, alloc_offset=0,
                        nbytes=512),
        "desc_unknown_type": enc(type="musa", version=1, metadata=meta, handle=1),
        "desc_no_metadata": enc(type="cpu_shm", version=1, **shm),
        "desc_complex_dtype": enc(type="cpu_shm", version=1,
                                  metadata=dict(meta, dtype="complex64"), **shm),
        "desc_past_its_segment": enc(type="cpu_shm", version=1, metadata=meta,
                                     shm_name="/lmcache_kv_1_1", nbytes=511),
        "desc_negative_offset": enc(type="cpu_shm", version=1,
                                    metadata=dict(meta, storage_offset=-1), **shm),
        "desc_shape_is_a_string": enc(type="cpu_shm", version=1,
                                      metadata=dict(meta, shape="2,16,8"), **shm),
        "desc_raw_short_handle": enc(type="cuda_raw", version=1, metadata=meta,
                                     ipc_handle=b"h" * 63, alloc_offset=0, nbytes=512),
        "desc_cuda_empty_storage": enc(type="cuda", version=1, metadata=meta,
                                       handle=[0, None, 0, 0, None, 0, None, False]),
        "desc_huge_shape": enc(type="cpu_shm", version=1,
                               metadata=dict(meta, shape=[2**62, 2**62, 8]), **shm),
        "desc_truncated": d.cpu_shm("/lmcache_kv_1_1", [2, 16, 8])[:-3],
        "desc_deep": enc(type="cpu_shm", version=1, metadata={"dtype": [[[[[1]]]]]}, **shm),
    }


def render(good, bad):
    lines = ["/* Generated by tests/pickles/gen_vectors.py; do not edit. */",
             "#ifndef LMC_TESTS_PICKLE_VECTORS_H", "#define LMC_TESTS_PICKLE_VECTORS_H",
             "", "#include <stddef.h>", "#include <stdint.h>", ""]
    for prefix, group in (("good", good), ("bad", bad)):
        for name, data in group.items():
            lines.append(f"static const uint8_t {prefix}_{name}[{len(data)}] = {{")
            for i in range(0, len(data), 16):
                lines.append("    " + ", ".join(f"0x{b:02x}" for b in data[i:i + 16]) + ",")
            lines.append("};")
    lines += ["", "#endif", ""]
    return "\n".join(lines)


def main():
    text = render(*vectors())
    if "--check" in sys.argv:
        current = open(OUT).read() if os.path.exists(OUT) else ""
        if current != text:
            sys.exit(f"{OUT} is out of date: run tests/pickles/gen_vectors.py")
        print("1 passed, 0 failed: pickle_vectors.h matches gen_vectors.py")
        return
    with open(OUT, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
