"""One rank of the DDP test: train a small model compiled with torchfuse, and the same model
eagerly, under DistributedDataParallel (gloo, CPU); write both gradients to a file."""
from __future__ import annotations

import datetime
import faulthandler
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torchfuse


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


def train_step(model: torch.nn.Module, rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    x = torch.randn(8, 16, generator=generator)
    target = torch.randint(0, 4, (8,), generator=generator)
    loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def main() -> None:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    # If this rank hangs, print every thread's stack before the test gives up on it.
    faulthandler.dump_traceback_later(150, exit=True)
    # A file rendezvous and a short timeout: a broken network set-up fails in a minute with a
    # message instead of hanging the test run.
    dist.init_process_group("gloo", init_method=os.environ.get("TORCHFUSE_DDP_INIT", "env://"),
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    eager = DistributedDataParallel(make_model())
    # The pattern PyTorch recommends: compile the module, then wrap it in DDP.
    inner = torchfuse.compile(make_model(), options={"target": "triton", "strict": True})
    compiled = DistributedDataParallel(inner)
    grads_eager = train_step(eager, rank)
    grads_compiled = train_step(compiled, rank)
    generated = sum(len(g.generated_kernels) for g in torchfuse.report().graphs)
    torch.save({"eager": grads_eager, "compiled": grads_compiled, "kernels": generated}, out)
    # Tearing down DDP's reducers and the gloo group at interpreter exit sometimes hangs
    # (seen about one run in ten, after the results were written): wait for the other rank,
    # then leave without running any destructor.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
