"""torchfuse under DistributedDataParallel: two gloo processes on loopback, gradients as eager's."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).parent / "helpers" / "ddp_worker.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_ddp_gradients_match_eager(tmp_path):
    # Loopback only: gloo otherwise picks the interface the host name resolves to, which on some
    # CI machines is unreachable and makes the rendezvous hang.
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", TORCHFUSE_DDP_INIT=f"file://{tmp_path / 'rendezvous'}")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")])
    world = 2
    outputs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen([sys.executable, "-u", str(WORKER), str(r), str(world), str(outputs[r])], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            partial = [p.communicate()[0][-2000:] for p in procs]
            pytest.fail("DDP workers did not finish in 240 s; their output:\n" + "\n---\n".join(partial))
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
    results = [torch.load(path) for path in outputs]
    for result in results:
        assert result["kernels"] > 0  # the model really ran through generated kernels
        for eager, compiled in zip(result["eager"], result["compiled"]):
            torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    # DDP averaged the gradients: every rank holds the same values.
    for a, b in zip(results[0]["compiled"], results[1]["compiled"]):
        torch.testing.assert_close(a, b)
