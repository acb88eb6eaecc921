"""What a GPU model's graphs would compile to, found on a machine without a GPU.

Each bench case is built on the CPU (its quick size) and traced through torchfuse's own frontend
(aot_autograd, decompositions, attention and linear rewrites). Every forward and backward ATen
graph is then re-traced with fake CUDA tensors (factory calls' ``device=cpu`` become CUDA; 0-d
``scalar_tensor`` stays on the CPU, as decompositions leave it in GPU graphs) and compiled up to
the wrapper with ``mode="reduce-overhead"``. Printed per graph: kernels, kernels built for the
CPU (C++) and why CUDA graphs would be refused. That is the question "can this model's graphs be
CUDA graphs at all?", answered before spending device time. Empty CPU tensor constants
(transformers' cache placeholders) become CUDA ``empty`` calls; convolutions take cuDNN's layouts
(channels-last in, channels-last out).

    python scripts/fake_cuda_graphs.py --cases t5_train,mistral_train
    python scripts/fake_cuda_graphs.py --cases swin_t_train --full --sources /tmp/swin

``--full`` builds the bench's size (the CPU runs one real step of it: minutes, gigabytes);
``--torchvision-stand-in`` lets timm's models build without a working torchvision;
``--sources DIR`` writes each GPU kernel's source, headed by the bytes it reads and writes,
largest first (kernel names are digests of their source, so a name from a GPU profile finds
its file when the CPU trace matches the GPU's), with the launch the GPU would make at the
traced size (``launch.Launcher``'s default config for the predicted sizes: grid, block, warps). Needs the case's model library
(transformers for the HF cases). Limits: the CPU trace is the CPU's: autocast follows CPU
rules and attention takes the CPU's SDPA path.
"""
from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from functorch.compile import make_boxed_func
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from torchfuse.bench import suites
from torchfuse.diagnostics.report import report
from torchfuse.frontend.aot import aot_backend
from torchfuse.options import Options
from torchfuse.pipeline import compile_graph, run_captured
from torchfuse.runtime import triton_ahead
from torchfuse.runtime.predict import PredictedLaunch

CUDA = torch.device("cuda")


def capture(case_name: str, quick: bool = True) -> list[tuple[str, torch.fx.GraphModule, list[Any]]]:
    """The ATen graphs (kind, graph, example inputs) of one step of the case, traced on the CPU."""
    (case,) = suites.select("models", torch.device("cuda"), {case_name})
    workload = case.build(torch.device("cpu"), quick)
    return capture_step(lambda backend: workload.make_step(lambda model: torch.compile(model, backend=backend)))


def capture_step(make_step: Callable[[Any], Callable[[], Any]]) -> list[tuple[str, torch.fx.GraphModule, list[Any]]]:
    """The ATen graphs of one call of ``make_step(backend)``'s step, traced on the CPU through
    torchfuse's frontend (its decompositions and rewrites) with ``backend`` as torch.compile's."""
    graphs = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any], kind: str) -> Any:
        graphs.append((kind, gm, example_inputs))
        return make_boxed_func(gm.forward)

    make_step(aot_backend(keep, run_captured, strict=True))()
    return graphs


def on_fake_cuda(gm: torch.fx.GraphModule, inputs: list[Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``gm`` re-traced with fake CUDA inputs, its factory calls moved to CUDA."""
    for node in list(gm.graph.nodes):
        if (node.op == "call_function" and node.kwargs.get("device") == torch.device("cpu")
                and node.target is not torch.ops.aten.scalar_tensor.default):
            node.kwargs = {**node.kwargs, "device": CUDA}
        elif node.op == "get_attr" and _empty_cpu_tensor(getattr(gm, node.target, None)):
            # transformers' cache placeholders (torch.tensor([])): nothing to read, so a CUDA
            # ``empty`` stands in (a CPU constant beside CUDA tensors fails the trace)
            value = getattr(gm, node.target)
            with gm.graph.inserting_after(node):
                empty = gm.graph.call_function(torch.ops.aten.empty.memory_format, (list(value.shape),),
                                               {"dtype": value.dtype, "device": CUDA})
            node.replace_all_uses_with(empty)
            gm.graph.erase_node(node)
    gm.recompile()
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=CUDA)
                 if isinstance(x, torch.Tensor) else x for x in inputs]
    return make_fx(gm, tracing_mode="fake")(*fakes), fakes


def use_cudnn_layouts() -> None:
    """Fake CUDA convolutions laid out as cuDNN lays them out. A build without CUDA has no cuDNN,
    so the fake convolution's layout rule answers "contiguous" for every CUDA convolution, and a
    channels-last network's activations would be traced NCHW. cuDNN (bf16, half and float) gives
    a channels-last result when the input or the weight is channels-last."""
    original = torch._C._conv_determine_backend_memory_format

    def determine(input_: torch.Tensor, weight: torch.Tensor, backend: Any) -> torch.memory_format:
        if input_.device.type == "cuda" and input_.dim() == 4 and torch.channels_last in (
                suggest_memory_format(input_), suggest_memory_format(weight)):
            return torch.channels_last
        return original(input_, weight, backend)

    torch._C._conv_determine_backend_memory_format = determine


def _empty_cpu_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel() == 0 and value.dim() > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="comma-separated bench case names")
    parser.add_argument("--full", action="store_true", help="the bench's size, not the quick one")
    parser.add_argument("--sources", type=Path, help="write GPU kernel sources here")
    parser.add_argument("--torchvision-stand-in", action="store_true",
                        help="import timm without torchvision (scripts/torchvision_stand_in.py)")
    args = parser.parse_args()
    if args.torchvision_stand_in:
        import torchvision_stand_in  # noqa: F401 - installs itself; this script's folder is on sys.path
    warnings.filterwarnings("ignore")
    use_cudnn_layouts()
    options = Options.from_user({"strict": True}, "reduce-overhead")
    configs = record_launch_configs()
    for name in args.cases.split(","):
        for kind, gm, inputs in capture(name, quick=not args.full):
            configs.clear()  # kernel names (kernelN) repeat between graphs
            try:
                compile_graph(*on_fake_cuda(gm, inputs), kind, options)
            except Exception as error:  # noqa: BLE001 - e.g. a CPU tensor constant read by a CUDA op
                print(f"{name} {kind}: not emulated ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
                continue
            graph = report().graphs[-1]
            cpu_kernels = [k for k in graph.kernels if k.source and 'extern "C"' in k.source]
            stages = ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in graph.stage_seconds.items())
            combined = graph.combined_launches
            launches = len(graph.kernels) - sum(len(parts) for parts in combined.values()) + len(combined)
            print(f"{name} {kind}: {len(graph.kernels)} kernels in {launches} launches, {len(cpu_kernels)} on the CPU; "
                  f"CUDA graphs: {dict(graph.cudagraphs) or 'usable'}; our stages (s): {stages}")
            for kernel in cpu_kernels:
                print(f"    CPU kernel {kernel.name}: {', '.join(kernel.ops)}")
            for note in graph.device_notes:
                print(f"    {note}")
            if args.sources:
                write_sources(args.sources / f"{name}_{kind}", graph.kernels, configs)


def record_launch_configs() -> dict[str, str]:
    """Kernel name -> the default launch config of its predicted launch, filled as graphs compile
    (on fake CUDA nothing is compiled ahead: ``compile_ahead`` is only watched here)."""
    configs: dict[str, str] = {}
    compile_ahead = triton_ahead.compile_ahead

    def watching(kernels: dict, fns: dict, predictions: dict, *args: Any, **kwargs: Any) -> Any:
        for name, launch in predictions.items():
            if isinstance(launch, PredictedLaunch) and name in kernels:
                config = triton_ahead.default_config(kernels[name], launch)
                block = " x ".join(str(size) for size in config.constexprs)
                configs[name] = f"grid {config.grid} [{block}] w{config.num_warps}"
        return compile_ahead(kernels, fns, predictions, *args, **kwargs)

    triton_ahead.compile_ahead = watching
    return configs


def write_sources(folder: Path, kernels: list, configs: dict[str, str]) -> None:
    """Each generated kernel's source, headed by its traffic; an index, largest first."""
    folder.mkdir(parents=True, exist_ok=True)
    sized = [(k, (k.bytes_read or 0) + (k.bytes_written or 0)) for k in kernels if k.source and k.kind != "extern"]
    lines = []
    for kernel, moved in sorted(sized, key=lambda pair: -pair[1]):
        names = re.findall(r"^def (\w+)\(", kernel.source, re.MULTILINE)  # as a GPU profile names it
        name = names[-1] if names else kernel.name
        config = configs.get(kernel.name, "")
        lines.append(f"{moved / 1e6:10.1f} MB  {name}  {kernel.name}  {config:<30}  {', '.join(kernel.ops)[:100]}")
        accesses = [f"# reads  {a}" for a in kernel.reads] + [f"# writes {a}" for a in kernel.writes]
        accesses += [f"# launch {config}"] if config else []
        (folder / f"{name}.py").write_text("\n".join(accesses) + "\n" + kernel.source)
    (folder / "index.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
