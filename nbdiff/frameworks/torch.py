"""PyTorch adapter. torch is imported here only, when a torch object is seen."""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import numpy as np
import torch

from nbdiff.errors import OptionError
from nbdiff.frameworks.base import cores, framework_class_names, own_entries, spread_around

__all__ = ["TorchFramework"]

_DROPOUT_TYPES = (torch.nn.modules.dropout._DropoutNd,)
_MODULE = torch.nn.Module


_REDUCED = (torch.float32, torch.float64)
_DTYPE_NAMES: dict[Any, str] = {}  # torch dtype -> its name without "torch."
_CHUNK = 1 << 20
"""Values :func:`_extremes_and_sums` squares (or takes the magnitude of) at a time."""
_SCRATCH = threading.local()


def _extremes_and_sums(flat: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> list[float]:
    """``lo``, ``hi`` and the sums of ``x``, ``x**2`` and ``|x|`` over a flat tensor, read back at once.

    ``x**2`` and ``|x|`` are written into a scratch of at most :data:`_CHUNK` values, made once per
    thread, device and dtype (4 MiB in float32). A temporary the size of each tensor faulted in fresh
    pages whenever glibc had handed the last one back: a 2 MiB activation reduced in 1,150 µs, against
    140 with the scratch. torch's float sums are cascaded within a chunk (within about 1e-8 of
    float64's; a BLAS dot was off by 7e-6), and the chunks' sums add up in float64."""
    pool = _SCRATCH.__dict__.setdefault("pool", {})
    key = (flat.device, flat.dtype)
    scratch = pool.get(key)
    if scratch is None or scratch.numel() < min(_CHUNK, flat.numel()):
        scratch = pool[key] = torch.empty(_CHUNK, dtype=flat.dtype, device=flat.device)
    parts = []
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start : start + _CHUNK]
        out = scratch[: chunk.numel()]
        parts.append(
            torch.stack((chunk.sum(), torch.mul(chunk, chunk, out=out).sum(), torch.abs(chunk, out=out).sum()))
        )
    values = torch.cat((torch.stack((lo, hi)), torch.stack(parts).reshape(-1))).tolist()  # one transfer
    return [values[0], values[1], *(math.fsum(values[2 + i :: 3]) for i in range(3))]


@functools.cache
def _accelerators_possible() -> bool:
    """Whether any device but the CPU has a random generator torch seeds (read once: whether a
    device is there does not change in a process)."""
    devices = (torch.cuda, getattr(torch, "xpu", None), getattr(torch, "mtia", None))
    if any(d is not None and d.is_available() for d in devices):
        return True
    if torch.backends.mps.is_available():
        return True
    return hasattr(torch, torch._C._get_privateuse1_backend_name())  # a registered custom device


class TorchFramework:
    """The :class:`~nbdiff.frameworks.base.Framework` for torch."""

    name = "torch"
    version = str(torch.__version__)
    source_roots: tuple[str, ...] = (os.path.dirname(torch.__file__),)

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, (torch.nn.Module, torch.Tensor, torch.optim.Optimizer))

    def is_layer(self, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module)

    def is_layer_class(self, cls: Any) -> bool:
        return isinstance(cls, type) and issubclass(cls, torch.nn.Module)

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)

    def is_optimizer(self, obj: Any) -> bool:
        return isinstance(obj, torch.optim.Optimizer)

    def named_layers(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.named_modules())

    def children(self, layer: Any) -> list[tuple[str, Any]]:
        return list(layer.named_children())

    def direct_params(self, layer: Any) -> list[tuple[str, Any]]:
        if type(layer).named_parameters is not _MODULE.named_parameters:  # a wrapper's own naming
            return list(layer.named_parameters(recurse=False))
        return own_entries(layer._parameters)

    def direct_buffers(self, layer: Any) -> list[tuple[str, Any]]:
        if type(layer).named_buffers is not _MODULE.named_buffers:
            return [(n, b) for n, b in layer.named_buffers(recurse=False) if b is not None]
        return own_entries(layer._buffers)

    def constant_buffers(self, layer: Any) -> set[str]:
        return set(getattr(layer, "_non_persistent_buffers_set", ()))

    def is_trainable(self, param: Any) -> bool:
        return bool(param.requires_grad)

    def is_library_layer(self, layer: Any) -> bool:
        return type(layer).__module__.startswith("torch.")

    def class_names(self, layer: Any) -> list[str]:
        return framework_class_names("torch.", layer)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        t = tensor.detach()
        if type(t) is not torch.Tensor and hasattr(t, "to_local"):
            t = t.to_local()  # a DTensor: this rank's shard (its layout is layout_of's)
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()

    def from_numpy(self, array: np.ndarray, requires_grad: bool = False, device: Any = None) -> Any:
        t = torch.from_numpy(np.array(array, copy=True, order="C"))
        if device is not None:
            t = t.to(device)
        if requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t

    def drop_forward_hooks(self, model: Any) -> None:
        for m in model.modules():
            for hooks in (m._forward_pre_hooks, m._forward_hooks, m._forward_pre_hooks_with_kwargs,
                          m._forward_hooks_with_kwargs, m._forward_hooks_always_called):  # fmt: skip
                hooks.clear()

    def device_of(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            first = next(itertools.chain(obj.parameters(), obj.buffers()), None) if isinstance(obj, _MODULE) else None
            if first is None:
                return None
            obj = first
        return None if obj.device.type in ("cpu", "meta") else obj.device

    def set_value(self, tensor: Any, array: np.ndarray) -> None:
        with torch.no_grad():
            # copy_ reads the array where it lies (and casts, and moves it to the tensor's device): a copy
            # first only where torch cannot wrap it (read-only, or not C-ordered).
            writable = array.flags.writeable and array.flags.c_contiguous
            tensor.copy_(torch.from_numpy(array if writable else np.array(array, copy=True, order="C")))

    def grad_of(self, param: Any) -> Any | None:
        return param.grad

    def dtype_name(self, tensor: Any) -> str:
        dtype = tensor.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:  # str(dtype) and a replace, asked of every tensor recorded: 0.45 µs against 0.1
            name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return name

    def shape_of(self, tensor: Any) -> tuple[int, ...]:
        if type(tensor) is not torch.Tensor and hasattr(tensor, "to_local"):
            return tuple(tensor.to_local().shape)
        return tuple(tensor.shape)

    def layout_of(self, tensor: Any) -> str:
        if type(tensor) is torch.Tensor or not hasattr(tensor, "placements"):
            return ""
        names = tensor.device_mesh.mesh_dim_names or ()
        return ",".join(
            _placement(p, tensor.ndim) + (f"@{names[i]}" if i < len(names) else "")
            for i, p in enumerate(tensor.placements)
        )

    def requires_grad(self, tensor: Any) -> bool:
        return bool(tensor.requires_grad)

    def is_floating(self, tensor: Any) -> bool:
        return bool(tensor.is_floating_point())

    def has_values(self, tensor: Any) -> bool:
        return not tensor.is_meta

    def unhookable(self, layer: Any) -> str | None:
        return None  # no torch forward is known to fail under the hooks

    def detach(self, tensor: Any) -> Any:
        return tensor.detach()

    def tensor_version(self, tensor: Any) -> int:
        return int(tensor._version)

    def gradient_alias_key(self, grad: Any) -> Hashable | None:
        # A layer's input gradient and the output gradient of the layer before are one buffer
        # seen through two views (the identity node's backward is a view): half of all gradients.
        if grad.layout != torch.strided or type(grad) is not torch.Tensor:
            return None  # sparse, or a subclass (DTensor, a functorch wrapper) whose memory is elsewhere
        return (grad.data_ptr(), grad.device, grad.dtype, tuple(grad.shape), grad.stride(), grad._version)

    whole_gradients = True

    def reduced(
        self, tensor: Any, positions: np.ndarray
    ) -> tuple[list[float], np.ndarray, Callable[[float], float]] | None:
        t = tensor.detach()
        if type(t) is not torch.Tensor or t.dtype not in _REDUCED or t.numel() == 0:
            return None  # a DTensor's reductions would gather every rank's shard
        flat = t.reshape(-1)
        lo, hi = torch.aminmax(flat)
        sums = _extremes_and_sums(flat, lo, hi)
        sample = flat[torch.tensor(positions, dtype=torch.int64, device=flat.device)].cpu().numpy()
        return sums, sample, functools.partial(spread_around, flat)

    def prefers_reducing(self, tensor: Any) -> bool:
        # A torch CNN's statistics dump with default threads (both cores torch's): 3.30-3.77x its
        # bare step copying, 2.36-3.11x reducing. With one thread, 2.17-2.38x against 2.45-2.61x.
        return tensor.device.type != "cpu" or self.cores_taken(tensor)

    def cores_taken(self, tensor: Any) -> bool:
        return tensor.device.type == "cpu" and torch.get_num_threads() >= cores()

    def identity(self, tensor: Any, copy: bool = False) -> Any:
        return tensor.clone() if copy else tensor.view_as(tensor)

    def with_value(self, tensor: Any, value: Any) -> Any:
        return tensor + (value.to(tensor.dtype) - tensor.detach())

    def hook_forward(self, layer: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> list:
        return [
            layer.register_forward_pre_hook(pre, with_kwargs=True),
            layer.register_forward_hook(post, with_kwargs=True),
        ]

    def hook_tensor(self, tensor: Any, fn: Callable[[Any], Any]) -> Any:
        return tensor.register_hook(fn)

    def remove_tensor_hooks(self, handles: Sequence[Any]) -> None:
        for h in handles:
            h.remove()

    def distributed_rank(self) -> tuple[int, int] | None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
        return None

    def framework_probe(self) -> bool:
        frame = sys._getframe(2)
        for _ in range(_PROBE_DEPTH):
            if frame is None:
                return False
            if frame.f_code.co_name in _PROBES and "pipelining" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    def mesh_of(self, mesh: Any, model: Any) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]] | None:
        if mesh is None:
            # The mesh of the first named DTensor parameter (FSDP's, or parallelize_module's submesh),
            # widened to the mesh it was cut from: a (dp, tp) job's parameters may lie on "tp" alone.
            for p in model.parameters():
                sub = getattr(p, "device_mesh", None)
                if sub is not None and sub.mesh_dim_names:
                    root = sub._get_root_mesh() if hasattr(sub, "_get_root_mesh") else sub
                    mesh = root if root.mesh_dim_names else sub
                    break
            else:
                return None
        if not hasattr(mesh, "get_coordinate"):
            raise OptionError(f"record(mesh={type(mesh).__name__}): expected torch's DeviceMesh or {{name: size}}.")
        names = tuple(mesh.mesh_dim_names or (f"dim{i}" for i in range(mesh.ndim)))
        coordinate = mesh.get_coordinate()
        if coordinate is None:
            raise OptionError("record(mesh=...): this rank is not on the mesh given; pass the mesh it runs on.")
        return tuple(mesh.mesh.shape), names, tuple(int(c) for c in coordinate)

    def api_tracing(self, callback: Any) -> AbstractContextManager[Any]:
        """Report every torch function, ``torch.nn.functional`` call and Tensor method/operator."""
        from torch.overrides import TorchFunctionMode

        from nbdiff.trace.apis import CUSTOM_TARGETS, patched

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = kwargs or {}
                out = func(*args, **kwargs)  # the mode is off inside: nested calls are not reported
                name = getattr(func, "__name__", None)
                if name:
                    callback(name, args, kwargs, out)
                return out

        stack = ExitStack()
        stack.enter_context(patched(CUSTOM_TARGETS, callback))
        stack.enter_context(Mode())
        return stack

    def no_grad(self) -> AbstractContextManager[Any]:
        return torch.no_grad()

    def sequence(self, layers: Sequence[Any]) -> Any:
        return torch.nn.Sequential(*layers)  # the layers keep their own parents; this one is not kept

    @contextmanager
    def optimizer_steps(self, callback: Any, after: Any = None) -> Iterator[None]:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles = [register_optimizer_step_pre_hook(lambda opt, args, kwargs: callback(opt))]
        if after is not None:
            handles.append(register_optimizer_step_post_hook(lambda opt, args, kwargs: after(opt)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def grad_enabled(self) -> bool:
        return bool(torch.is_grad_enabled())

    def seed(self, seed: int) -> None:
        if _accelerators_possible():
            torch.manual_seed(seed)
        else:
            # torch.manual_seed also queues a seed for CUDA, XPU and MTIA should they start later,
            # with a formatted stack each time (100-230 µs a call, deeper in a notebook): where none
            # can start, seeding the CPU generator is all it does.
            torch.default_generator.manual_seed(seed)

    def layer_internals(self) -> frozenset[str]:
        return _MODULE_INTERNALS

    def rng_state(self) -> Any:
        # CPU and every initialised accelerator, as torch.random.fork_rng keeps them.
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.random.get_rng_state(), cuda

    def set_rng_state(self, state: Any) -> None:
        cpu, cuda = state
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    def backward(self, loss: Any) -> None:
        loss.backward()

    def grad(self, outputs: Sequence[Any], inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any | None]:
        return list(torch.autograd.grad(list(outputs), list(inputs), list(grad_outputs), allow_unused=True))

    def weighted_mean_of(self, tensors: Sequence[Any], weights: np.ndarray) -> Any:
        flat = [t.reshape(-1).float() if t.dtype != torch.float64 else t.reshape(-1) for t in tensors]
        values = torch.cat(flat) if len(flat) > 1 else flat[0]
        return (values * torch.from_numpy(weights).to(values.device, values.dtype)).mean()

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()

    def zero_grad(self, model: Any, optimizer: Any | None) -> None:
        if optimizer is not None and self.is_optimizer(optimizer):
            optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)

    def is_training(self, layer: Any) -> bool:
        return bool(layer.training)

    def set_training(self, layer: Any, training: bool) -> None:
        layer.training = training

    def dropout_attrs(self, layer: Any) -> Iterator[str]:
        if isinstance(layer, _DROPOUT_TYPES):
            yield "p"
        elif isinstance(layer, torch.nn.MultiheadAttention):
            yield "dropout"


_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | {"training"}
"""Attributes every torch module keeps for itself (hooks, parameters, submodules): not the user's state."""


_PROBES = frozenset({"_forward_metadata_inference", "_shape_inference"})
"""torch.distributed.pipelining's calls of a stage on empty tensors, to learn its shapes."""
_PROBE_DEPTH = 12
"""Frames looked up from a root call for one: the stage's call is a few frames below it."""


def _placement(p: Any, ndim: int) -> str:
    """One DTensor placement as a dump names it (``Shard(-1)`` of a 3-d tensor is ``shard(2)``; FSDP's
    shard of a tensor-parallel shard, ``_StridedShard(0, sf=2)``, is ``strided(0,2)``)."""
    if getattr(p, "split_factor", None) is not None:  # not is_shard(): it was recorded as replicate
        return f"strided({p.dim % max(ndim, 1)},{int(p.split_factor)})"
    if p.is_shard():
        return f"shard({p.dim % max(ndim, 1)})"
    return "partial" if p.is_partial() else "replicate"
