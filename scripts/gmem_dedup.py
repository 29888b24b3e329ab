"""Marks GPU memory read-only for gmem's cross-process dedup (include/gmem/dedup.h).

In a job under gmem with GMEM_CONF=pool:vmm,dedup:1 and a broker running
(gmemd --dedup), after the weights are on the GPU:

    import gmem_dedup                      # scripts/ on sys.path, or copy this file
    report = gmem_dedup.mark_module(model) # {'marked': n, 'marked_bytes': b, 'skipped': {...}}
    ...                                    # inference only: marked memory is read-only
    gmem_dedup.unmark_module(model)        # before the weights are written again

Each tensor must be its own allocation for it to be shared: with PyTorch, run
with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (the caching allocator
places several tensors in one segment). Tensors of 1 MiB or less are never
shared (the pool carves them from shared slabs); they come back as NOT_POOLED.
Writing a marked tensor is an illegal-address error that ends the CUDA
context (docs/dedup.md). Needs nothing but the standard library (ctypes).
"""
import ctypes

OK, DISABLED, INVALID, NOT_POOLED, SPANS, NOT_MARKED, DRIVER_ERROR, NO_BROKER = range(8)
STATUS = {OK: "OK", DISABLED: "DISABLED", INVALID: "INVALID", NOT_POOLED: "NOT_POOLED", SPANS: "SPANS",
          NOT_MARKED: "NOT_MARKED", DRIVER_ERROR: "DRIVER_ERROR", NO_BROKER: "NO_BROKER"}
PRIVATE, MARKED, SHARED = range(3)


class Unavailable(RuntimeError):
    """The process is not running under gmem (no gmem_dedup_mark to call)."""


_api = None


def _functions():
    global _api
    if _api is None:
        # Preloaded, the shim is in the global namespace; placed first on the
        # library path, it is the libcuda.so.1 already loaded.
        for name in (None, "libcuda.so.1"):
            try:
                lib = ctypes.CDLL(name)
                mark = lib.gmem_dedup_mark
            except (OSError, AttributeError):
                continue
            mark.argtypes, mark.restype = [ctypes.c_ulonglong, ctypes.c_size_t], ctypes.c_int
            lib.gmem_dedup_unmark.argtypes, lib.gmem_dedup_unmark.restype = [ctypes.c_ulonglong], ctypes.c_int
            lib.gmem_dedup_query.argtypes = [ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
            lib.gmem_dedup_query.restype = ctypes.c_int
            lib.gmem_dedup_last_driver_error.restype = ctypes.c_int
            _api = lib
            break
        else:
            raise Unavailable("gmem_dedup_mark not found: run under gmem (LD_PRELOAD=.../libcuda.so.1 "
                              "or gmemctl run) with GMEM_CONF=pool:vmm,dedup:1")
    return _api


def available():
    """Whether the process runs under a gmem shim that has the dedup API."""
    try:
        _functions()
        return True
    except Unavailable:
        return False


def mark_range(ptr, size):
    """Declares [ptr, ptr + size) of device memory read-only; returns a status (OK...)."""
    return _functions().gmem_dedup_mark(int(ptr), int(size))


def unmark(ptr):
    """Private, writable memory again for the allocation holding ptr; returns a status."""
    return _functions().gmem_dedup_unmark(int(ptr))


def state(ptr):
    """PRIVATE, MARKED or SHARED for the allocation holding ptr (None if gmem cannot tell)."""
    out = ctypes.c_int(-1)
    return out.value if _functions().gmem_dedup_query(int(ptr), ctypes.byref(out)) == OK else None


def _extent(tensor):
    if not getattr(tensor, "is_cuda", False):
        raise ValueError("not a CUDA tensor")
    if not tensor.is_contiguous():
        raise ValueError("not contiguous: its bytes are not one range")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


def mark_tensor(tensor):
    """Marks a contiguous CUDA tensor's bytes read-only; returns a status."""
    ptr, size = _extent(tensor)
    return mark_range(ptr, size) if size else INVALID


def mark_module(module, buffers=False):
    """Marks every parameter (and buffer, with buffers=True) of a torch module
    read-only. Returns {'marked': count, 'marked_bytes': bytes, 'shared_bytes':
    bytes now mapped on another process's copy, 'skipped': {status name: count}}."""
    report = {"marked": 0, "marked_bytes": 0, "shared_bytes": 0, "skipped": {}}
    tensors = list(module.parameters()) + (list(module.buffers()) if buffers else [])
    seen = set()
    for t in tensors:
        ptr, size = _extent(t)
        if ptr in seen or not size:
            continue
        seen.add(ptr)
        status = mark_range(ptr, size)
        if status == OK:
            report["marked"] += 1
            report["marked_bytes"] += size
            if state(ptr) == SHARED:
                report["shared_bytes"] += size
        else:
            name = STATUS.get(status, str(status))
            report["skipped"][name] = report["skipped"].get(name, 0) + 1
    return report


def unmark_module(module, buffers=False):
    """Unmarks what mark_module marked; returns the number of tensors unmarked."""
    tensors = list(module.parameters()) + (list(module.buffers()) if buffers else [])
    done = 0
    for t in tensors:
        ptr, _ = _extent(t)
        done += unmark(ptr) == OK
    return done
