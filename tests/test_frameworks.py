"""The framework adapters' reads of a layer's own tensors: the same as the frameworks' public walks."""

from __future__ import annotations

import pytest

from nbdiff.frameworks.base import own_entries


def test_own_entries_leaves_out_unset_and_lists_a_shared_tensor_once() -> None:
    shared, other = object(), object()
    assert own_entries({"a": shared, "b": None, "c": other, "tied": shared}) == [("a", shared), ("c", other)]


class _Renaming:
    """A wrapper's own naming of its tensors (as FSDP's strips prefixes): the adapters must ask it."""

    def named_parameters(self, *args, **kwargs):
        for n, p in super().named_parameters(*args, **kwargs):
            yield "renamed_" + n, p

    def named_buffers(self, *args, **kwargs):
        yield "renamed_buffer", self.weight


def _torch_layers() -> list:
    torch = pytest.importorskip("torch")

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))
            self.v = self.w  # one parameter, two names
            self.register_buffer("unset", None)
            self.register_buffer("kept", torch.zeros(2))
            self.register_buffer("constant", torch.ones(1), persistent=False)
            self.inner = torch.nn.Linear(2, 2)  # a sublayer's tensors are its own

    class Renamed(_Renaming, torch.nn.Linear):
        pass

    return [torch.nn.Linear(2, 3, bias=False), torch.nn.BatchNorm1d(3), Tied(), Renamed(2, 2), torch.nn.Tanh()]


def _paddle_layers() -> list:
    paddle = pytest.importorskip("paddle")

    class Tied(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.w = self.create_parameter([2])
            self.v = self.w
            self.register_buffer("kept", paddle.zeros([2]))
            self.register_buffer("constant", paddle.ones([1]), persistable=False)
            self.inner = paddle.nn.Linear(2, 2)

    class Renamed(_Renaming, paddle.nn.Linear):
        pass

    return [paddle.nn.Linear(2, 3, bias_attr=False), paddle.nn.BatchNorm1D(3), Tied(), Renamed(2, 2), paddle.nn.Tanh()]


@pytest.mark.parametrize("name", ["torch", "paddle"])
def test_a_layers_own_tensors_are_what_its_public_walk_lists(name: str) -> None:
    if name == "torch":
        layers = _torch_layers()
        from nbdiff.frameworks.torch import TorchFramework as Adapter

        def public(layer):
            return list(layer.named_parameters(recurse=False)), list(layer.named_buffers(recurse=False))
    else:
        layers = _paddle_layers()
        from nbdiff.frameworks.paddle import PaddleFramework as Adapter

        def public(layer):
            return (
                list(layer.named_parameters(include_sublayers=False)),
                [(n, b) for n, b in layer.named_buffers(include_sublayers=False) if b is not None],
            )

    fw = Adapter()
    for layer in layers:
        params, buffers = public(layer)
        got_params, got_buffers = fw.direct_params(layer), fw.direct_buffers(layer)
        assert [(n, id(t)) for n, t in got_params] == [(n, id(t)) for n, t in params], type(layer).__name__
        assert [(n, id(t)) for n, t in got_buffers] == [(n, id(t)) for n, t in buffers], type(layer).__name__
    renamed = layers[3]
    assert {n for n, _ in fw.direct_params(renamed)} == {"renamed_weight", "renamed_bias"}
    assert [n for n, _ in fw.direct_buffers(renamed)] == ["renamed_buffer"]


def test_a_plain_attribute_is_read_without_the_layers_getattr() -> None:
    from nbdiff.frameworks.base import plain_attr

    asked: list[str] = []

    class Layer:
        inplace = True  # a class attribute

        def __init__(self) -> None:
            self.act = "gelu"

        @property
        def computed(self) -> int:
            return 3

        def __getattr__(self, name: str):  # a framework's: looks through its dicts, then raises
            asked.append(name)
            raise AttributeError(name)

    layer = Layer()
    assert plain_attr(layer, "act") == "gelu"
    assert plain_attr(layer, "inplace", False) is True
    assert plain_attr(layer, "computed") == 3
    assert plain_attr(layer, "missing", "default") == "default"
    assert plain_attr(None, "missing") is None
    assert asked == []


def test_paddle_to_numpy_reads_small_large_and_strided_tensors_alike() -> None:
    # Small contiguous tensors come through paddle's own copy, the rest through DLPack.
    import numpy as np

    paddle = pytest.importorskip("paddle")
    from nbdiff.frameworks.paddle import PaddleFramework

    fw = PaddleFramework()
    for values in (np.arange(24, dtype="float32").reshape(4, 6), np.ones((300, 300), "float32"), np.float32(3.0)):
        t = paddle.to_tensor(values, stop_gradient=False) * 1.0  # a graph tensor, as a hook sees it
        for view in (t, t.transpose([1, 0]) if t.ndim == 2 else t, t.astype("bfloat16"), t.astype("float16")):
            want = np.asarray(view.astype("float32").numpy())
            got = fw.to_numpy(view)
            assert got.shape == want.shape and np.array_equal(np.asarray(got, dtype="float32"), want)


def _reduced_cases() -> list:
    torch = pytest.importorskip("torch")
    paddle = pytest.importorskip("paddle")
    from nbdiff.frameworks.paddle import PaddleFramework
    from nbdiff.frameworks.torch import TorchFramework

    return [(TorchFramework(), torch.from_numpy), (PaddleFramework(), paddle.to_tensor)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_tensor_reduced_by_its_framework_gives_the_sums_and_sample_of_its_values(dtype) -> None:
    import numpy as np

    from nbdiff.trace.stats import sample_positions, tensor_sample

    x = (np.random.default_rng(2).standard_normal((8, 3, 17, 19)) * 3 + 0.5).astype(dtype)
    ref = x.astype(np.float64)
    want = [ref.min(), ref.max(), ref.sum(), (ref * ref).sum(), np.abs(ref).sum()]
    for fw, make in _reduced_cases():
        sums, sample, spread = fw.reduced(make(x.copy()), sample_positions(x.size))
        # Cascaded float sums: within 1e-6 of float64's (a BLAS dot product was off by 7e-6).
        np.testing.assert_allclose(sums, want, rtol=1e-6, atol=1e-6 * np.abs(ref).sum())
        np.testing.assert_array_equal(sample, tensor_sample(x))
        assert spread(0.5) == pytest.approx(((ref - 0.5) ** 2).sum(), rel=1e-6)


def test_tensors_a_framework_cannot_reduce_are_left_to_the_host_copy() -> None:
    import numpy as np

    paddle = pytest.importorskip("paddle")
    positions = np.arange(2)
    for fw, make in _reduced_cases():
        assert fw.reduced(make(np.arange(4)), positions) is None  # integers
        assert fw.reduced(make(np.zeros(0, np.float32)), positions) is None
        assert fw.reduced(make(np.ones(4, np.float16)), positions) is None  # its sums would round
    fw, make = _reduced_cases()[1]
    with paddle.amp.auto_cast():  # elementwise work may run in float16 there
        assert fw.reduced(make(np.ones(4, np.float32)), positions) is None


def test_a_framework_reduces_where_a_host_copy_would_cost_more(monkeypatch) -> None:
    # Measured on a CNN's statistics dump (bench_dump.py): torch's reductions pay where its threads take
    # every core, not where one is left to the writer's thread; paddle's cost its thread more than a copy.
    import numpy as np

    from nbdiff.frameworks import base
    from nbdiff.frameworks import torch as torch_adapter

    (torch_fw, make_torch), (paddle_fw, make_paddle) = _reduced_cases()
    monkeypatch.setattr(torch_adapter, "cores", lambda: 2)
    t = make_torch(np.ones(4, np.float32))
    # torch's threads take every core with as many threads as cores (a dump is then written in the
    # training thread, and reduced by torch).
    for threads, taken in ((1, False), (2, True), (4, True)):
        monkeypatch.setattr(torch_adapter.torch, "get_num_threads", lambda n=threads: n)
        assert torch_fw.cores_taken(t) is taken and torch_fw.prefers_reducing(t) is taken
    p = make_paddle(np.ones(4, np.float32))
    assert not paddle_fw.prefers_reducing(p) and not paddle_fw.cores_taken(p)
    assert base.cores() >= 1


def test_torch_seeding_draws_what_manual_seed_draws_without_queueing_seeds_for_absent_devices(monkeypatch) -> None:
    """On a machine with no accelerator, seeding a step reseeds the CPU generator only: torch's
    ``manual_seed`` formatted a stack for CUDA's lazy queue on every step (100-230 µs a call)."""
    torch = pytest.importorskip("torch")
    import traceback

    from nbdiff.frameworks import torch as adapter

    fw = adapter.TorchFramework()
    torch.manual_seed(11)
    expected = torch.rand(5)
    torch.rand(3)  # the generator moved on
    formatted = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: formatted.append(1) or [])
    fw.seed(11)
    assert torch.equal(torch.rand(5), expected)
    if not adapter._accelerators_possible():
        assert formatted == []
    # Where a device could start later, torch's own seeding queues its seed as before.
    seeded = []
    monkeypatch.setattr(adapter, "_accelerators_possible", lambda: True)
    monkeypatch.setattr(torch, "manual_seed", lambda s: seeded.append(s))
    fw.seed(4)
    assert seeded == [4]


def test_torch_reduces_a_tensor_in_chunks_through_one_scratch_without_a_temporary_its_size(monkeypatch) -> None:
    """``x**2`` and ``|x|`` went into temporaries the size of the tensor: fresh pages, faulted in again
    whenever the allocator had handed the last ones back (a 2 MiB activation: 1,150 µs, against 140)."""
    import warnings

    import numpy as np

    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    from nbdiff.frameworks import torch as adapter
    from nbdiff.trace.stats import sample_positions

    fw = adapter.TorchFramework()
    t = torch.randn(300_000)
    positions = sample_positions(t.numel())
    fw.reduced(t, positions)  # the scratch is made once
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fw.reduced(t, positions)
    assert max(e.cpu_memory_usage for e in prof.events()) < t.numel() * 4 // 8
    # Over several chunks, the sums are still the values' own.
    monkeypatch.setattr(adapter, "_CHUNK", 1000)
    x = torch.randn(2_500, dtype=torch.float64) * 3 + 0.5
    sums, _, _ = fw.reduced(x, sample_positions(x.numel()))
    a = x.numpy()
    assert sums[:2] == [a.min(), a.max()]
    np.testing.assert_allclose(sums[2:], [a.sum(), (a * a).sum(), np.abs(a).sum()], rtol=1e-12)
    # A scratch made smaller than a later chunk is made again, not written past (torch would resize it).
    monkeypatch.setattr(adapter, "_CHUNK", 4000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, _, _ = fw.reduced(x, sample_positions(x.numel()))
    np.testing.assert_allclose(again, sums, rtol=1e-12)


def test_reading_a_paddle_model_says_nothing_of_ccache():
    # paddle warns on import that it found no ccache: a line every notebook and `nbdiff compare` showed.
    import subprocess
    import sys

    pytest.importorskip("paddle")
    code = "import warnings; warnings.simplefilter('default'); import nbdiff.frameworks.paddle"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "ccache" not in run.stderr, run.stderr
