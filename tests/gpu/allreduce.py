"""A 2-process NCCL all-reduce through torch.distributed, one process per GPU.
Each rank contributes (rank + 1) in a 256 MiB tensor; every element of the sum
must equal n(n+1)/2. Run it under the shim to check NCCL's own allocations and
VMM use pass through gmem."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.full((64 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(x == expected).item())
    print(f"rank {rank}: all_reduce sum {x[0].item()} expected {expected}: {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                       ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[var] = value  # never NVLink multicast on the shared machines
    world = torch.cuda.device_count()
    if world < 2:
        print("allreduce: needs 2 GPUs, found", world)
        sys.exit(77)
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
