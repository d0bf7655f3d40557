"""PaddlePaddle adapter. paddle is imported here only, when a paddle object is seen."""

from __future__ import annotations

import functools
import itertools
import math
import os
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

with warnings.catch_warnings():
    # paddle warns on import that it found no ccache (for building C++ extensions): nothing nbdiff's
    # users build, said each time a notebook or `nbdiff compare` first reads a paddle model.
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
    import paddle

from nbdiff.errors import OptionError
from nbdiff.frameworks.base import framework_class_names, own_entries, spread_around

__all__ = ["PaddleFramework"]

_DTYPE_NAMES: dict[Any, str] = {}
"""paddle dtype -> its name (``float32``): :meth:`PaddleFramework.dtype_name`."""
_BFLOAT16, _FLOAT32 = paddle.bfloat16, paddle.float32
_COPIED_MAX = 1 << 16
"""Values up to which :meth:`PaddleFramework.to_numpy` takes paddle's own copy."""
_VIEW_SHAPE = getattr(paddle._C_ops, "view_shape", None)
"""The op ``Tensor.view(shape)`` runs, called without its decorator and checks (2.3 against 4.2-5.0 µs):
each recorded layer input that needs a gradient gets its own view."""
_DROPOUT_NAMES = {"Dropout", "Dropout2D", "Dropout3D", "AlphaDropout", "FeatureAlphaDropout"}


_NOT_APIS = {
    "to_tensor", "seed", "set_device", "get_device", "save", "load", "no_grad", "grad", "enable_static",
    "disable_static", "in_dynamic_mode", "set_flags", "get_flags", "is_tensor", "set_default_dtype",
    "get_default_dtype", "set_grad_enabled", "is_grad_enabled", "enable_grad", "shape", "numel", "rank",
    "is_floating_point", "is_complex", "is_integer", "summary", "flops", "jit", "DataParallel", "ParamAttr",
    "create_parameter", "set_printoptions", "check_shape", "assign",
}  # fmt: skip
_TENSOR_OPS = (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__matmul__", "__rmatmul__", "__pow__", "__rpow__", "__neg__", "__getitem__", "matmul", "reshape",
    "transpose", "exp", "log", "tanh", "sigmoid", "sqrt", "rsqrt", "sum", "mean", "max", "min", "pow",
    "flatten", "unsqueeze", "squeeze", "split", "chunk", "expand", "abs", "clip", "scale", "softmax",
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def _api_table() -> list[tuple[Any, str, str]]:
    """``(owner, attribute, name)`` of the public APIs to wrap: functional, math, linalg, fft, Tensor."""
    import inspect

    table: list[tuple[Any, str, str]] = []
    for mod in (paddle, paddle.nn.functional, paddle.linalg, paddle.fft):
        for name in getattr(mod, "__all__", ()):
            fn = getattr(mod, name, None)
            if name in _NOT_APIS or name.startswith("_") or not callable(fn) or inspect.isclass(fn):
                continue
            table.append((mod, name, name))
    table += [(paddle.Tensor, op, op) for op in _TENSOR_OPS if hasattr(paddle.Tensor, op)]
    return table


class _WeakHook:
    """A gradient hook's handle that does not keep its tensor alive. A tensor gone before the
    hook is removed took the hook's last reference with it, or left it to a graph that ran
    backward once, which frees it; the recorder's hooks do nothing once removed."""

    __slots__ = ("tensor", "hook_id")

    def __init__(self, tensor: weakref.ref, hook_id: int) -> None:
        self.tensor, self.hook_id = tensor, hook_id

    def remove(self) -> None:
        t = self.tensor()
        if t is not None:
            t._remove_grad_hook(self.hook_id)


try:
    from paddle.amp.auto_cast import amp_state as _amp_state
except ImportError:  # an older paddle: no state to read, no reduction trusted under it either

    def _amp_state() -> dict[str, Any] | None:
        return {"enable": True}


def _distributed(t: Any) -> bool:
    is_dist = getattr(t, "is_dist", None)
    return bool(is_dist()) if callable(is_dist) else False


class PaddleFramework:
    """The :class:`~nbdiff.frameworks.base.Framework` for paddle."""

    name = "paddle"
    version = paddle.__version__
    source_roots: tuple[str, ...] = (os.path.dirname(paddle.__file__),)

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, (paddle.nn.Layer, paddle.Tensor, paddle.optimizer.Optimizer))

    def is_layer(self, obj: Any) -> bool:
        return isinstance(obj, paddle.nn.Layer)

    def is_layer_class(self, cls: Any) -> bool:
        return isinstance(cls, type) and issubclass(cls, paddle.nn.Layer)

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, paddle.Tensor)

    def is_optimizer(self, obj: Any) -> bool:
        return isinstance(obj, paddle.optimizer.Optimizer)

    def named_layers(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.named_sublayers(include_self=True))

    def children(self, layer: Any) -> list[tuple[str, Any]]:
        return list(layer.named_children())

    def direct_params(self, layer: Any) -> list[tuple[str, Any]]:
        if type(layer).named_parameters is not paddle.nn.Layer.named_parameters:  # a wrapper's own naming
            return list(layer.named_parameters(include_sublayers=False))
        return own_entries(layer._parameters)

    def direct_buffers(self, layer: Any) -> list[tuple[str, Any]]:
        if type(layer).named_buffers is not paddle.nn.Layer.named_buffers:
            return [(n, b) for n, b in layer.named_buffers(include_sublayers=False) if b is not None]
        return own_entries(layer._buffers)

    def constant_buffers(self, layer: Any) -> set[str]:
        return set(getattr(layer, "_non_persistable_buffer_names_set", ()))

    def is_trainable(self, param: Any) -> bool:
        return not param.stop_gradient and getattr(param, "trainable", True)

    def is_library_layer(self, layer: Any) -> bool:
        return type(layer).__module__.startswith("paddle.")

    def class_names(self, layer: Any) -> list[str]:
        return framework_class_names("paddle.", layer)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        # The hot path of every recorded tensor: paddle's dtype ``==`` costs 0.4 µs, ``is`` 0.1
        # (dtypes are singletons; ``==`` still decides any other float's), and ``numpy()`` needs no detach.
        dtype = tensor.dtype
        if dtype is _BFLOAT16 or (dtype is not _FLOAT32 and dtype == _BFLOAT16):
            return tensor.detach().astype("float32").numpy()
        # The size first: the place is read only for the few tensors it decides (0.6 µs).
        if not (math.prod(tensor.shape) <= _COPIED_MAX and tensor.is_contiguous()) and tensor.place.is_cpu_place():
            # Zero-copy, like torch's .numpy(): Tensor.numpy() copies and costs ~10x more.
            return np.from_dlpack(tensor.detach())
        # Small: Tensor.numpy()'s copy (1.8 µs for 4,096 values) costs less than DLPack's handshake
        # (5.6 µs), and its buffer, paddle's, goes back to paddle's pool once the caller's copy is made.
        return tensor.numpy()

    def from_numpy(self, array: np.ndarray, requires_grad: bool = False, device: Any = None) -> Any:
        t = paddle.to_tensor(np.array(array, order="C"), place=device)
        t.stop_gradient = not (requires_grad and t.is_floating_point())
        return t

    def drop_forward_hooks(self, model: Any) -> None:
        for layer in model.sublayers(include_self=True):
            for name in ("_forward_pre_hooks", "_forward_post_hooks"):
                hooks = getattr(layer, name, None)
                if hooks is not None:
                    hooks.clear()

    def device_of(self, obj: Any) -> Any:
        if not isinstance(obj, paddle.Tensor):
            named = obj.named_parameters(), obj.named_buffers()
            first = next(itertools.chain(*named), None) if isinstance(obj, paddle.nn.Layer) else None
            if first is None:
                return None
            obj = first[1]
        return None if obj.place.is_cpu_place() else obj.place

    def set_value(self, tensor: Any, array: np.ndarray) -> None:
        dtype = self.dtype_name(tensor)
        if dtype == "bfloat16":  # numpy has no bfloat16: values arrive as float32 and are cast by paddle
            tensor.set_value(paddle.to_tensor(np.asarray(array, dtype="float32", order="C")).astype(dtype))
            return
        # np.require keeps a 0-d array 0-d (np.ascontiguousarray makes it (1,), which paddle refuses).
        tensor.set_value(np.require(array, requirements="C").astype(dtype, copy=False))  # paddle copies it

    def grad_of(self, param: Any) -> Any | None:
        return param.grad

    def dtype_name(self, tensor: Any) -> str:
        dtype = tensor.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:  # paddle's str(dtype) costs 1.5 µs, asked of every tensor recorded
            name = _DTYPE_NAMES[dtype] = str(dtype).replace("paddle.", "")
        return name

    def shape_of(self, tensor: Any) -> tuple[int, ...]:
        return tuple(tensor.shape)

    def layout_of(self, tensor: Any) -> str:
        # fleet's model-parallel layers (ColumnParallelLinear...) hold plain tensors, each rank its
        # own shard: compare lays them out by class and by the user's map (gather/shards).
        return ""

    def requires_grad(self, tensor: Any) -> bool:
        return not tensor.stop_gradient

    def is_floating(self, tensor: Any) -> bool:
        return bool(tensor.is_floating_point())

    def has_values(self, tensor: Any) -> bool:
        return True  # paddle has no meta device

    def unhookable(self, layer: Any) -> str | None:
        # to_static's symbolic translation (SOT, the default) rewrites forward's bytecode, and the
        # translated frame fails under layer hooks (UnboundLocalError '___graph_fn_saved_orig_1').
        if type(vars(layer).get("forward")).__name__ != "SymbolicStaticFunction":
            return None
        return (
            "its forward is compiled by paddle.jit.to_static (symbolic translation), which fails under the hooks "
            "nbdiff records each layer call with. Give nbdiff the layer before paddle.jit.to_static (keep a reference "
            "to it), or translate with paddle.jit.to_static(model, full_graph=True)"
        )

    def detach(self, tensor: Any) -> Any:
        return tensor.detach()

    def tensor_version(self, tensor: Any) -> int:
        return int(tensor.inplace_version)

    def gradient_alias_key(self, grad: Any) -> Hashable | None:
        return None  # paddle adds the next contribution into the gradient a hook was handed

    whole_gradients = False  # a hook per contribution: the recorder adds them up

    def reduced(
        self, tensor: Any, positions: np.ndarray
    ) -> tuple[list[float], np.ndarray, Callable[[float], float]] | None:
        t = tensor.detach()
        if t.dtype not in (paddle.float32, paddle.float64) or math.prod(t.shape) == 0 or _distributed(t):
            return None
        if (_amp_state() or {}).get("enable"):
            return None  # under auto_cast, elementwise work may run in float16
        flat = t.reshape([-1])
        sums = paddle.stack([flat.min(), flat.max(), flat.sum(), (flat * flat).sum(), flat.abs().sum()]).tolist()
        sample = paddle.gather(flat, paddle.to_tensor(np.asarray(positions, dtype=np.int64), place=flat.place)).numpy()
        return sums, sample, functools.partial(spread_around, flat)

    def prefers_reducing(self, tensor: Any) -> bool:
        # On a CPU, paddle's reductions cost its thread more than a copy: a paddle CNN's statistics
        # dump took 1.70-1.85x its bare step reducing, 1.43-1.50x copying for the writer's thread.
        return not tensor.place.is_cpu_place()

    def cores_taken(self, tensor: Any) -> bool:
        # A paddle CNN's dumps with default threads cost 1.29-1.38x its bare step with the writer's
        # thread beside paddle's: a core is left for it.
        return False

    def identity(self, tensor: Any, copy: bool = False) -> Any:
        if copy:
            return tensor.clone()
        return _VIEW_SHAPE(tensor, tensor.shape) if _VIEW_SHAPE is not None else tensor.view(tensor.shape)

    def with_value(self, tensor: Any, value: Any) -> Any:
        return tensor + (value.astype(tensor.dtype) - tensor.detach())

    def hook_forward(self, layer: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> list:
        return [
            layer.register_forward_pre_hook(pre, with_kwargs=True),
            layer.register_forward_post_hook(post, with_kwargs=True),
        ]

    def hook_tensor(self, tensor: Any, fn: Callable[[Any], Any]) -> Any:
        # paddle's own handle holds the tensor: every hooked activation would live till the
        # step's end. The hook itself lives in the autograd graph and fires without the wrapper.
        try:
            return _WeakHook(weakref.ref(tensor), tensor._register_grad_hook(fn))
        except (TypeError, AttributeError):
            return tensor.register_hook(fn)

    def remove_tensor_hooks(self, handles: Sequence[Any]) -> None:
        # An in-place op on a hooked output (``y.add_(x)`` in a residual block) replaces the tensor's
        # hooks; removing ours afterwards made paddle warn "does not exist or has been removed" to the
        # user, about nbdiff's own bookkeeping. One filter for the whole batch, not one per hook.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The backward hook .* does not exist", category=RuntimeWarning)
            for h in handles:
                h.remove()

    def distributed_rank(self) -> tuple[int, int] | None:
        world = int(paddle.distributed.get_world_size())
        return (int(paddle.distributed.get_rank()), world) if world > 1 else None

    def framework_probe(self) -> bool:
        return False

    def mesh_of(self, mesh: Any, model: Any) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]] | None:
        # fleet's hybrid-parallel layers hold plain tensors: a job says its mesh ({"dp": 2, "mp": 2}, or
        # its ProcessMesh).
        if mesh is None:
            return None
        if not hasattr(mesh, "process_ids") or not hasattr(mesh, "dim_names"):
            raise OptionError(f"record(mesh={type(mesh).__name__}): expected paddle's ProcessMesh or {{name: size}}.")
        ids = np.array(mesh.process_ids).reshape(mesh.shape)
        found = np.argwhere(ids == paddle.distributed.get_rank())
        if not len(found):
            raise OptionError("record(mesh=...): this rank is not on the mesh given; pass the mesh it runs on.")
        return tuple(mesh.shape), tuple(mesh.dim_names), tuple(int(c) for c in found[0])

    def api_tracing(self, callback: Any) -> AbstractContextManager[Any]:
        """Report calls of paddle's public functions and Tensor methods/operators (wrapped here only)."""
        from nbdiff.trace.apis import CUSTOM_TARGETS, patched

        return patched(_api_table() + CUSTOM_TARGETS, callback)

    def no_grad(self) -> AbstractContextManager[Any]:
        return paddle.no_grad()

    def sequence(self, layers: Sequence[Any]) -> Any:
        return paddle.nn.Sequential(*layers)  # the layers keep their own parents; this one is not kept

    def optimizer_steps(self, callback: Any, after: Any = None) -> AbstractContextManager[Any]:
        from nbdiff.frameworks.patching import patched

        classes = {paddle.optimizer.Optimizer, *(c for c in vars(paddle.optimizer).values() if isinstance(c, type))}
        targets = [(c, "step", "step") for c in classes if isinstance(c, type) and "step" in vars(c)]

        def stepped(name: str, args: tuple, kwargs: dict, out: Any) -> None:  # reported once the step ran
            if args:
                callback(args[0])
                if after is not None:
                    after(args[0])

        return patched(targets, stepped)

    def grad_enabled(self) -> bool:
        return bool(paddle.is_grad_enabled())

    def seed(self, seed: int) -> None:
        paddle.seed(seed)

    def layer_internals(self) -> frozenset[str]:
        return _LAYER_INTERNALS

    def rng_state(self) -> Any:
        return paddle.get_rng_state()  # the generators of the current device (paddle.seed sets them)

    def set_rng_state(self, state: Any) -> None:
        paddle.set_rng_state(state)

    def backward(self, loss: Any) -> None:
        try:
            loss.backward()
        except OSError as exc:
            if "KeyboardInterrupt" in str(exc):  # a Ctrl-C in a PyLayer or hook, which paddle wraps
                raise KeyboardInterrupt from None
            raise

    def grad(self, outputs: Sequence[Any], inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any | None]:
        return list(paddle.grad(list(outputs), list(inputs), list(grad_outputs), allow_unused=True))

    def weighted_mean_of(self, tensors: Sequence[Any], weights: np.ndarray) -> Any:
        flat = [t.reshape([-1]).astype("float32") if t.dtype != paddle.float64 else t.reshape([-1]) for t in tensors]
        values = paddle.concat(flat) if len(flat) > 1 else flat[0]
        return (values * paddle.to_tensor(weights, place=values.place).astype(values.dtype)).mean()

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()

    def zero_grad(self, model: Any, optimizer: Any | None) -> None:
        if optimizer is not None and self.is_optimizer(optimizer):
            optimizer.clear_grad()
        model.clear_gradients()

    def is_training(self, layer: Any) -> bool:
        return bool(layer.training)

    def set_training(self, layer: Any, training: bool) -> None:
        layer.training = training

    def dropout_attrs(self, layer: Any) -> Iterator[str]:
        names = set(self.class_names(layer))
        if names & _DROPOUT_NAMES:
            yield "p"
        elif "MultiHeadAttention" in names:
            yield "dropout"


_LAYER_INTERNALS = frozenset(vars(paddle.nn.Layer())) | {"training"}
"""Attributes every paddle layer keeps for itself (hooks, parameters, sublayers): not the user's state."""
