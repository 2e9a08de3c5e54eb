"""Loading a user's model file (the ``hapc compile MODEL.py`` contract).

A model file defines ``model()`` -> ``nn.Module`` whose forward returns the scalar loss,
``inputs()`` -> tuple of example tensors for one global batch, and optionally
``optimizer(params)``. Keyword overrides (``--set layers=2``) go to both functions, so one
file describes a family of sizes. Every mistake is a one-line :class:`UserError` naming the
file and what is missing.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hapc.errors import UserError

if TYPE_CHECKING:
    import torch

    from hapc.frontend.tracer import Traced


@dataclass
class ModelFile:
    path: str
    module: ModuleType
    overrides: dict[str, Any] = field(default_factory=dict)

    def build_model(self, device: str | None = None) -> torch.nn.Module:
        import torch        # here, not at the top: a trace-cache hit never builds the model

        fn = self._fn("model")
        try:
            if device:
                with torch.device(device):
                    m = fn(**self._kwargs(fn))
            else:
                m = fn(**self._kwargs(fn))
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"model() raised {type(exc).__name__}: {_first_line(exc)}", where=self.path) from exc
        if not isinstance(m, torch.nn.Module):
            raise UserError(f"model() must return a torch.nn.Module, got {type(m).__name__}", where=self.path)
        return m

    def build_inputs(self) -> tuple[torch.Tensor, ...]:
        import torch

        fn = self._fn("inputs")
        try:
            x = fn(**self._kwargs(fn))
        except Exception as exc:
            raise UserError(f"inputs() raised {type(exc).__name__}: {_first_line(exc)}", where=self.path) from exc
        x = tuple(x) if isinstance(x, (list, tuple)) else (x,)
        if not all(isinstance(t, torch.Tensor) for t in x):
            raise UserError("inputs() must return a tuple of tensors", where=self.path)
        return x

    @property
    def optimizer(self) -> Callable | None:
        return getattr(self.module, "optimizer", None)

    def _fn(self, name: str) -> Callable:
        fn = getattr(self.module, name, None)
        if not callable(fn):
            raise UserError(f"defines no {name}() function (a model file needs model() and inputs())",
                            where=self.path)
        return fn

    def _kwargs(self, fn: Callable) -> dict[str, Any]:
        if not self.overrides:
            return {}
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        kwargs = {k: v for k, v in self.overrides.items() if takes_any or k in params}
        unknown = set(self.overrides) - set(params) if not takes_any and fn.__name__ == "model" else set()
        if unknown:
            raise UserError(f"model() takes no parameter {sorted(unknown)[0]!r}", where=self.path)
        return kwargs


def load_model_file(path: str, overrides: dict[str, Any] | None = None) -> ModelFile:
    if not os.path.isfile(path):
        raise UserError("no such model file", where=path)
    name = "hapc_user_model_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError("not a Python file", where=path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UserError(f"syntax error at line {exc.lineno}: {exc.msg}", where=path) from exc
    except Exception as exc:
        raise UserError(f"importing it raised {type(exc).__name__}: {_first_line(exc)}", where=path) from exc
    mf = ModelFile(path, module, dict(overrides or {}))
    mf._fn("model")
    mf._fn("inputs")
    return mf


def trace_for_device(mf: ModelFile, trace: Callable[..., Traced], device: str = "cpu", *,
                     inputs: tuple[torch.Tensor, ...] | None = None, warn: bool = True) -> Traced:
    """Trace for ``device`` (``cpu`` or ``cuda``: the cluster's, see :mod:`hapc.frontend.ondevice`)
    without weights: the model built on the meta device, its tensors faked on ``device``. Falls
    back to real tensors on the CPU where the model cannot be built or traced without data.

    For ``cuda`` where this torch has no CUDA, fakes work only as far as no real CUDA tensor is
    needed (slicing a tensor is enough to need one): the trace then falls back to the meta
    device, as before device-faithful tracing, with a warning that names the line; if that
    fails too, the one-line error says why the ``cuda`` trace could not be made.
    ``inputs`` replaces the file's own (a pipeline's micro-batch)."""
    from hapc.frontend.ondevice import cuda_missing, on_device

    def example() -> tuple[torch.Tensor, ...]:
        return inputs if inputs is not None else mf.build_inputs()

    try:
        fake = on_device(mf.build_model(device="meta"), example(), device)
        traced = trace(fake.model, fake.inputs, trainable=fake.trainable)
        if not traced.dataless_constants():
            return traced
    except UserError as exc:
        refusal = cuda_missing(str(exc), device)
        if refusal is not None:
            return _meta_instead(mf, trace, example(), refusal, exc, warn)
    # Real tensors: also when the trace lifted tensors it made in forward (a list index,
    # torch.tensor(...)) without their data; a trace on CPU gives graph and data together.
    return trace(mf.build_model(), example())


def _meta_instead(mf: ModelFile, trace: Callable[..., Traced], inputs: tuple, refusal: str,
                  cause: UserError, warn: bool = True) -> Traced:
    """The trace on the meta device, for a ``cuda`` cluster that this process cannot trace for
    (``refusal`` says why), with a warning unless ``warn`` is false (a second trace of a model
    already warned about); ``refusal`` as the error when meta fails too."""
    try:
        traced = trace(mf.build_model(device="meta"), tuple(t.to("meta") for t in inputs))
    except UserError:
        raise UserError(refusal, where=mf.path) from cause
    if not warn:
        return traced
    print(f"hapc: warning: {mf.path}: traced on the meta device instead: {refusal.split(' (', 1)[0]} "
          f"({str(cause).removeprefix('torch.export could not trace the model: ')}); where the model branches "
          "on the device, the plan may hold another branch than a GPU takes", file=sys.stderr)
    return traced


def load_and_trace(path: str, overrides: dict[str, Any], *, device: str = "cpu",
                   quiet_imports: bool = True) -> Traced:
    """The model file at ``path`` loaded and traced for ``device`` with :func:`trace_for_device`.
    With ``quiet_imports`` (a process that compiles and ends), torch is imported first with the
    collector paused (:mod:`hapc.frontend.torchimport`; the model file would import it anyway)."""
    if quiet_imports and os.path.isfile(path):        # else the loader says what is wrong, at once
        from hapc.frontend.torchimport import import_for_tracing

        import_for_tracing()
    mf = load_model_file(path, overrides)
    from hapc.frontend.tracer import trace

    return trace_for_device(mf, trace, device)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["layers=2", "dropout=0.1", "name=x"]`` -> typed values (int, float, bool, str)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--set wants KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        out[key.strip()] = _parse_value(raw.strip())
    return out


def _parse_value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
