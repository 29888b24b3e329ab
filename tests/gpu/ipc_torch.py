"""CUDA tensors between processes with torch.multiprocessing, the DataLoader-
workers pattern, both ways, with the default caching allocator (its blocks
cross as cudaIpcGetMemHandle handles):
  parent -> child: the parent puts CUDA tensors into a Queue; the child (a
    spawned worker) checks their values and adds 1; the parent sees the write;
  child -> parent: the child puts CUDA tensors of its own; the parent checks
    them and adds 7; the child sees the write.
A small tensor (4 KB, carved from a shared block: the handle carries an
offset) and a large one (64 MiB). Prints one line per check; exits 1 if any
fails. Run natively, and under the shim (LD_PRELOAD, GMEM_CONF=pool:vmm):
scripts/gpu-test.sh ipc."""
import sys

import torch
import torch.multiprocessing as mp

SIZES = {"small": 1024, "large": 16 << 20}  # float32 elements
TIMEOUT_S = 120


def values(n, scale, offset):
    return torch.arange(n, dtype=torch.float32, device="cuda") * scale + offset


def worker(inbox, outbox):
    # Parent -> child: check, write.
    while (item := inbox.get(timeout=TIMEOUT_S)) is not None:
        name, tensor = item
        seen = bool(torch.equal(tensor, values(tensor.numel(), 1, 0)))
        tensor.add_(1)
        torch.cuda.synchronize()
        del tensor
        outbox.put((name, seen))
    # Child -> parent: ours, kept alive until the parent has written.
    for name, n in SIZES.items():
        tensor = values(n, 3, 0)
        torch.cuda.synchronize()
        outbox.put((name, tensor))
        inbox.get(timeout=TIMEOUT_S)  # the parent wrote
        outbox.put((name, bool(torch.equal(tensor, values(n, 3, 7)))))
        del tensor


def main():
    mp.set_start_method("spawn")
    inbox, outbox = mp.Queue(), mp.Queue()
    child = mp.Process(target=worker, args=(inbox, outbox))
    child.start()
    ok = True

    def report(what, passed):
        nonlocal ok
        ok &= passed
        print(f"ipc_torch: {what}: {'ok' if passed else 'FAIL'}", flush=True)

    mine = {name: values(n, 1, 0) for name, n in SIZES.items()}
    torch.cuda.synchronize()
    for name, tensor in mine.items():
        inbox.put((name, tensor))
        got, seen = outbox.get(timeout=TIMEOUT_S)
        report(f"parent -> child, {name}: the child reads the parent's values", got == name and seen)
        report(f"parent -> child, {name}: the parent sees the child's write",
               bool(torch.equal(tensor, values(SIZES[name], 1, 1))))
    inbox.put(None)
    for name, n in SIZES.items():
        got, theirs = outbox.get(timeout=TIMEOUT_S)
        report(f"child -> parent, {name}: the parent reads the child's values",
               got == name and bool(torch.equal(theirs, values(n, 3, 0))))
        theirs.add_(7)
        torch.cuda.synchronize()
        del theirs
        inbox.put("written")
        got, seen = outbox.get(timeout=TIMEOUT_S)
        report(f"child -> parent, {name}: the child sees the parent's write", got == name and seen)
    child.join(timeout=TIMEOUT_S)
    report("the child exits cleanly", child.exitcode == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
