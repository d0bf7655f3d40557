"""Summary statistics of one tensor: what statistics-only dumps keep and compare."""

from __future__ import annotations

import base64
import functools
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "Stats",
    "tensor_stats",
    "stats_from_sums",
    "concatenated_stats",
    "STAT_FIELDS",
    "SAMPLE_SIZE",
    "sample_positions",
    "tensor_sample",
    "sample_json",
    "sample_of_json",
    "check_sample_json",
    "decoded_sample",
    "SAMPLE_DTYPES",
]

STAT_FIELDS = ("min", "max", "mean", "std", "abs_mean")
"""The values a statistics comparison looks at, in this order."""
SAMPLE_SIZE = 64
"""Values a statistics dump keeps of each activation and its gradient, at positions drawn from its
size alone (the same on both sides): statistics do not change when channels are shuffled, and a
small epsilon moves them less than their tolerance, while each value it moves shows it."""
_CHUNK = 1 << 20  # elements per chunk: at most 8 MiB of scratch per thread, whatever the tensor's size
_ROW = 4096  # running sums per chunk in the tensor's own float type, added up in float64
_CANCELS = 0.8
"""``E[x^2] - mean^2`` is used while ``mean^2`` is at most this share of ``E[x^2]`` (the variance
at least a fifth of it): the float32 running sums' rounding (under 1e-6 of ``E[x^2]``, each sums
at most 256 squares) then moves the std by at most a few 1e-6 of itself."""


@dataclass(frozen=True)
class Stats:
    """Moments over the finite elements, plus NaN/Inf counts."""

    min: float
    max: float
    mean: float
    std: float
    abs_mean: float
    """Mean of absolute values (what ``abs_mean`` compare mode uses)."""
    nan: int
    inf: int

    def as_dict(self) -> dict[str, float | int]:
        return {f: getattr(self, f) for f in _ALL_FIELDS}  # dataclasses.asdict deep-copies: slow

    def values(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in STAT_FIELDS], dtype=np.float64)


def tensor_stats(a: np.ndarray) -> Stats:
    """Statistics of ``a`` (zeros for empty or non-numeric tensors).

    This runs on every recorded tensor of a dump, so it makes few passes and no large
    allocations: min and max (a NaN or Inf shows in them, so the finite mask is only built
    when one is there), then per chunk of ``_CHUNK`` elements a sum and a sum of squares.
    Each views the chunk as rows of ``_ROW`` elements and adds the rows up in the tensor's
    float type (``_ROW`` running sums, each of at most ``_CHUNK / _ROW`` terms: vectorised,
    and more exact than one pairwise sum), then those in float64. No BLAS: numpy's OpenBLAS
    starts its own threads for a long vector, and they spin on the cores the framework's
    threads compute on after every call (a torch CNN step recorded with default threads went
    from 3x to 5-6x its bare time). ``|x|`` is summed through a scratch buffer only when the
    signs are mixed (a ReLU's output is its own absolute value). The variance is
    ``E[x^2] - mean^2`` while the mean is not much larger than the spread; otherwise that
    cancels, and it is taken in a second pass around the mean (a constant tensor has a std
    of exactly 0: a scalar loss got 7e-6 from the difference).
    """
    x = np.asarray(a).ravel()
    if x.size == 0 or x.dtype.kind not in "biuf":
        return Stats(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)  # integers: exact up to 2**53
    elif x.itemsize < 4:
        x = x.astype(np.float32)  # float16 sums would round at every step
    lo, hi = float(x.min()), float(x.max())
    nan = inf = 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite = np.isfinite(x)
        nan = int(np.isnan(x).sum())
        inf = x.size - nan - int(finite.sum())
        x = x[finite]
        if x.size == 0:
            return Stats(0.0, 0.0, 0.0, 0.0, 0.0, nan, inf)
        lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        return Stats(lo, hi, lo, 0.0, abs(lo), nan, inf)
    n = x.size
    chunks = [x[i : i + _CHUNK] for i in range(0, n, _CHUNK)]
    total = sum(_sum(c) for c in chunks)
    mean = total / n
    if lo >= 0 or hi <= 0:
        abs_sum = abs(total)
    else:
        abs_sum = sum(_sum(np.abs(c, out=_scratch(c.size, x.dtype))) for c in chunks)
    squares = sum(_sum_of_squares(c) for c in chunks) / n
    var = _variance(mean, squares, lambda m: _spread_around(chunks, m, n))
    if not math.isfinite(var):  # squares past float32's range (|x| > 1.8e19): in float64 then
        var = _spread_around([c.astype(np.float64) for c in chunks], mean, n)
    return Stats(lo, hi, mean, max(var, 0.0) ** 0.5, abs_sum / n, nan, inf)


def stats_from_sums(
    lo: float, hi: float, total: float, squares: float, abs_total: float, n: int, spread: Callable[[float], float]
) -> Stats | None:
    """The statistics of ``n`` values from their min, max and sums of ``x``, ``x**2`` and ``|x|`` (a
    framework's own reductions), as :func:`tensor_stats` makes them: ``spread(m)``, the sum of
    ``(x - m)**2``, is asked for where ``E[x^2] - mean^2`` would cancel. ``None`` where a value is
    not finite (NaN or Inf in the tensor, squares past float32's range): :func:`tensor_stats` counts those."""
    if not all(math.isfinite(v) for v in (lo, hi, total, squares, abs_total)):
        return None
    if lo == hi:
        return Stats(lo, hi, lo, 0.0, abs(lo), 0, 0)
    mean = total / n
    var = _variance(mean, squares / n, lambda m: spread(m) / n)
    if not math.isfinite(var):
        return None
    return Stats(lo, hi, mean, max(var, 0.0) ** 0.5, abs_total / n, 0, 0)


def _variance(mean: float, mean_square: float, spread: Callable[[float], float]) -> float:
    """``E[x^2] - mean^2``, or ``spread(mean)`` (the mean square of ``x - mean``: one more pass)
    where that would cancel, the mean being much larger than the spread."""
    return mean_square - mean * mean if mean * mean <= _CANCELS * mean_square else spread(mean)


def _spread_around(chunks: list[np.ndarray], mean: float, n: int) -> float:
    """The variance as the mean square of ``x - mean``: no cancellation, one more pass."""
    around = chunks[0].dtype.type(mean)
    square_sum = 0.0
    for c in chunks:
        scratch = np.subtract(c, around, out=_scratch(c.size, c.dtype))
        square_sum += _sum_of_squares(scratch)
    shift = mean - float(around)  # the squares were taken around the mean rounded to x's type
    return square_sum / n - shift * shift


def _rows(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``c`` as whole rows of ``_ROW`` elements, and the rest (in float64: too few to matter)."""
    whole = c.size // _ROW * _ROW
    return c[:whole].reshape(-1, _ROW), c[whole:].astype(np.float64)


def _sum(c: np.ndarray) -> float:
    rows, rest = _rows(c)
    head = float(np.add.reduce(np.add.reduce(rows, axis=0), dtype=np.float64)) if rows.size else 0.0
    return head + float(np.add.reduce(rest))


def _sum_of_squares(c: np.ndarray) -> float:
    rows, rest = _rows(c)
    head = float(np.add.reduce(np.einsum("ij,ij->j", rows, rows), dtype=np.float64)) if rows.size else 0.0
    return head + float(np.add.reduce(rest * rest))


_ALL_FIELDS = tuple(f.name for f in fields(Stats))
_buffers = threading.local()


def _scratch(size: int, dtype: np.dtype) -> np.ndarray:
    """A reused buffer per thread (a fresh one per tensor costs a page fault per 4 KiB)."""
    buf = getattr(_buffers, str(dtype), None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 4096), dtype)
        setattr(_buffers, str(dtype), buf)
    return buf[:size]


def concatenated_stats(parts: list[tuple[Stats, int]]) -> Stats:
    """The statistics of tensors concatenated (in any order), from each one's and its element count:
    what a fused layer's output looks like in a statistics-only dump."""
    finite = [(s, n - s.nan - s.inf) for s, n in parts]
    total = sum(n for _, n in finite)
    if total <= 0:
        return Stats(0.0, 0.0, 0.0, 0.0, 0.0, sum(s.nan for s, _ in parts), sum(s.inf for s, _ in parts))
    mean = sum(s.mean * n for s, n in finite) / total
    square = sum((s.std**2 + s.mean**2) * n for s, n in finite) / total
    return Stats(
        min(s.min for s, n in finite if n), max(s.max for s, n in finite if n), mean,
        math.sqrt(max(square - mean**2, 0.0)), sum(s.abs_mean * n for s, n in finite) / total,
        sum(s.nan for s, _ in parts), sum(s.inf for s, _ in parts),
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def sample_positions(n: int, k: int = SAMPLE_SIZE) -> np.ndarray:
    """``k`` flat positions in ``range(n)``, increasing (all of them when ``n <= k``): one in each of
    ``k`` equal stretches, at an offset a hash of the stretch's index picks (no lattice). Integer
    arithmetic only, so the two sides, recorded with other numpy versions, sample the same places."""
    if n <= k:
        picked = np.arange(n)
        picked.setflags(write=False)  # cached: shared by every caller
        return picked
    i = np.arange(k, dtype=np.int64)
    starts = i * n // k  # sizes up to 2**56 elements: far past any tensor
    widths = (i + 1) * n // k - starts  # each >= 1, since n > k
    h = (i.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)  # splitmix64's mix, wrapping
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(31)
    picked = starts + (h % widths.astype(np.uint64)).astype(np.int64)
    picked.setflags(write=False)
    return picked


def tensor_sample(a: np.ndarray, k: int = SAMPLE_SIZE) -> np.ndarray | None:
    """The values of ``a`` at :func:`sample_positions` (no copy of ``a``: indexed in place), or
    ``None`` for empty or non-floating tensors."""
    x = np.asarray(a)
    if x.size == 0 or x.dtype.kind != "f":
        return None
    at = sample_positions(x.size, k)
    return x[np.unravel_index(at, x.shape)] if x.ndim else x.reshape(1)


SAMPLE_DTYPES = ("float16", "float32", "float64")
_SAMPLE_MAX = 4096  # what a dump may claim: its positions are drawn for as many as it holds
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def sample_json(sample: np.ndarray) -> dict[str, str]:
    """A sample as JSON: its little-endian bytes in base64, exact and about a third of its values
    written as decimals (and made in a microsecond rather than forty)."""
    name, stored = _sample_dtype(sample.dtype)
    data = np.ascontiguousarray(sample, dtype=stored)
    return {"dtype": name, "base64": base64.b64encode(data.tobytes()).decode("ascii")}


@functools.lru_cache(maxsize=64)  # numpy's dtype.name costs 1.5 µs; a dump writes a sample per activation
def _sample_dtype(dtype: np.dtype) -> tuple[str, np.dtype]:
    """The name a sample of ``dtype`` is stored under, and its little-endian dtype."""
    name = dtype.name if dtype.name in SAMPLE_DTYPES else "float32"
    return name, np.dtype(name).newbyteorder("<")


def check_sample_json(value: dict[str, str], n: int) -> int:
    """How many values a sample read from a dump holds (``n``: its tensor's size, which bounds it);
    ``ValueError`` where it is not a sample. Checked without decoding it."""
    dtype, text = value.get("dtype"), value.get("base64")
    if dtype not in SAMPLE_DTYPES or not isinstance(text, str):
        raise ValueError(f"a sample is {{'dtype': one of {SAMPLE_DTYPES}, 'base64': its bytes}}")
    if len(text) % 4 or not _BASE64.fullmatch(text):
        raise ValueError("a sample's base64 does not decode")
    size, data = np.dtype(dtype).itemsize, len(text) // 4 * 3 - text.count("=", -2)
    if data % size or not 0 < data // size <= min(n, _SAMPLE_MAX):
        raise ValueError(
            f"a sample of a tensor of {n} values has 1 to {min(n, _SAMPLE_MAX)} of them, not {data / size:g}"
        )
    return data // size


def sample_of_json(value: dict[str, str], n: int) -> np.ndarray:
    """The sample back (see :func:`check_sample_json`)."""
    check_sample_json(value, n)
    return decoded_sample(value)


def decoded_sample(value: dict[str, str]) -> np.ndarray:
    """A sample :func:`check_sample_json` has passed, decoded (a dump's step is checked as it is read)."""
    data = base64.b64decode(value["base64"], validate=True)
    return np.frombuffer(data, dtype=np.dtype(value["dtype"]).newbyteorder("<")).astype(value["dtype"])
