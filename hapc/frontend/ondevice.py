"""Tracing for the device the program will run on, without its memory.

Model code may branch on the device: transformers' mixture-of-experts layers pick ``histc``'s
input dtype by ``device.type`` (integers on GPUs, floats on CPUs, whose kernel has no integer
form), attention picks a kernel by GPU capability. A trace on the meta device takes whichever
branch ``"meta"`` falls into, and the program then runs that branch on a device where the
model itself would take another: it crashes, or it trains another model than the one it
verifies against. So the model is traced for the target cluster's device type (``cpu`` or
``cuda``, as :func:`hapc.codegen.launch.run_device` decides the program's ``--device``).

The model is still built on the meta device (no weights: a 70B model plans in the memory of
its graph), and its parameters, buffers and example inputs are then wrapped as
:class:`torch._subclasses.fake_tensor.FakeTensor` s that report the target device: ops run on
meta kernels, ``x.device.type`` reads ``"cpu"`` or ``"cuda"``, and a tensor the model makes
from Python data in forward (a list index) comes back with its data on a CPU trace.
``torch.export`` accepts fake parameters and inputs and traces in their fake mode.

Tracing for ``cuda`` where torch has no CUDA (a CPU-only build, or no GPU) works as far as no
real CUDA tensor or driver is needed: autograd cannot record a CUDA leaf there (the process
aborts), so parameters are traced without ``requires_grad`` (their trainability is handed to
the tracer apart). Model code that asks the driver (``torch.cuda.get_device_capability``),
makes a real CUDA tensor (``torch.tensor(data, device=...)``), or indexes a tensor (torch's
indexing takes a CUDA device guard, which a CPU-only build lacks: every Hugging Face language
model does) cannot be traced so: :func:`cuda_missing` says why, and
:func:`hapc.frontend.modelfile.trace_for_device` traces on the meta device instead, warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

# The device types a trace may be made for: the program's ``--device`` choices.
TRACE_DEVICES = ("cpu", "cuda")


@dataclass
class OnDevice:
    """A model and its example inputs as fakes on ``device``; ``trainable`` maps every
    parameter name (tied names included) to whether it trains, which the trace cannot read
    from the fakes where they could not carry ``requires_grad``."""

    model: torch.nn.Module
    inputs: tuple
    device: str
    trainable: dict[str, bool]


def check_device(device: str) -> str:
    """``device`` if a trace can be made for it, else ValueError naming the choices."""
    if device not in TRACE_DEVICES:
        raise ValueError(f"cannot trace for device {device!r}; one of {', '.join(TRACE_DEVICES)}")
    return device


def no_cuda_here() -> bool:
    """Whether real CUDA tensors cannot be made in this process (no CUDA build, or no GPU)."""
    return not torch.cuda.is_available()


def on_device(model: torch.nn.Module, inputs: Sequence[torch.Tensor], device: str) -> OnDevice:
    """``model`` (built on the meta device) with every parameter and buffer replaced, in place,
    by a fake tensor on ``device``, and ``inputs`` as fakes on ``device``, all of one fake mode."""
    target = torch.device(check_device(device))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    grads = not (target.type == "cuda" and no_cuda_here())
    trainable = {name: p.requires_grad for name, p in model.named_parameters(remove_duplicate=False)}
    done: dict[int, torch.Tensor] = {}          # tied parameters and shared buffers stay so
    params: dict[int, torch.nn.Parameter] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in done:
            done[id(t)] = FakeTensor(mode, t.detach().to("meta"), target)
        return done[id(t)]

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in params:
                    params[id(p)] = torch.nn.Parameter(fake(p), requires_grad=p.requires_grad and grads)
                module._parameters[name] = params[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake(b)
    inputs = tuple(FakeTensor(mode, x.detach().to("meta"), target) if isinstance(x, torch.Tensor) else x
                   for x in inputs)
    return OnDevice(model, inputs, target.type, trainable)


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` carries no data (a fake or meta tensor)."""
    return t.is_meta or isinstance(t, FakeTensor)


CUDA_MISSING = ("not linked with support for cuda", "torch not compiled with cuda", "no nvidia driver",
                "no cuda gpus are available", "cuda driver", "found no nvidia")


def cuda_missing(message: str, device: str) -> str | None:
    """The one-line refusal for a trace for ``device`` that failed with ``message`` (a
    :class:`hapc.errors.UserError`'s text, which names the user's line) because this process
    has no CUDA; None when that is not why it failed."""
    if device != "cuda" or not no_cuda_here() or not any(s in message.lower() for s in CUDA_MISSING):
        return None
    detail = message.removeprefix("torch.export could not trace the model: ")
    return (f"cannot trace the model for the cluster's cuda devices here: its code needs a real GPU "
            f"and this torch has none ({detail}); compile on a machine with CUDA, or plan for a CPU cluster")
