"""Checkpoint tensors: safetensors read through mmap (bf16 included, no torch), shards, dummy weights.

A WeightSource hands out host arrays by checkpoint name; the backend stages them to the device.
safetensors' numpy API cannot read bf16, so the header is parsed here and the raw bytes mapped.
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol

import numpy as np

# safetensors dtype -> (numpy storage dtype, itemsize); bf16 is stored as uint16 bit patterns
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
           "F8_E4M3": np.uint8}   # fp8 e4m3 bytes as they are (quant/fp8.py decodes them)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


class WeightSource(Protocol):
    def names(self) -> Iterable[str]: ...
    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 (or its integer dtype), host memory."""
    def raw(self, name: str) -> tuple[str, tuple[int, ...], np.ndarray]:
        """(safetensors dtype, shape, storage array without conversion), for staging bf16 as is."""


class SafetensorsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        header.pop("__metadata__", None)
        self._base = 8 + n
        self.entries: dict[str, dict] = header

    def raw(self, name: str) -> tuple[str, tuple[int, ...], np.ndarray]:
        e = self.entries[name]
        dtype = e["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {dtype}")
        start, end = e["data_offsets"]
        arr = np.frombuffer(self._mm, dtype=_DTYPES[dtype], count=(end - start) // np.dtype(_DTYPES[dtype]).itemsize,
                            offset=self._base + start)
        return dtype, tuple(e["shape"]), arr.reshape(e["shape"])

    def span(self, name: str) -> tuple[int, int]:
        """(file offset, byte count) of a tensor's data, for reading it without the map."""
        start, end = self.entries[name]["data_offsets"]
        return self._base + start, end - start


class Checkpoint:
    """All safetensors files of a folder (single file or sharded with an index)."""

    def __init__(self, model_dir: str | Path) -> None:
        d = Path(model_dir)
        index = d / "model.safetensors.index.json"
        if index.exists():
            weight_map: Mapping[str, str] = json.loads(index.read_text())["weight_map"]
            files = {f: SafetensorsFile(d / f) for f in sorted(set(weight_map.values()))}
            self._where = {name: files[f] for name, f in weight_map.items()}
        else:
            paths = sorted(d.glob("*.safetensors"))
            if not paths:
                raise FileNotFoundError(f"no *.safetensors files in {d}")
            self._where = {}
            for p in paths:
                sf = SafetensorsFile(p)
                for name in sf.entries:
                    self._where[name] = sf

    def names(self) -> Iterable[str]:
        return self._where.keys()

    def raw(self, name: str) -> tuple[str, tuple[int, ...], np.ndarray]:
        if name not in self._where:
            raise KeyError(f"checkpoint has no tensor {name!r}")
        return self._where[name].raw(name)

    def span(self, name: str) -> tuple[str, int, int]:
        """(file path, offset, byte count) of a tensor's raw data."""
        if name not in self._where:
            raise KeyError(f"checkpoint has no tensor {name!r}")
        f = self._where[name]
        return (str(f.path), *f.span(name))

    def get(self, name: str) -> np.ndarray:
        dtype, _, arr = self.raw(name)
        if dtype == "BF16":
            return bf16_to_f32(arr)
        if dtype in ("F16", "F64"):
            return arr.astype(np.float32)
        return arr


class DummyWeights:
    """Random weights of the real shapes (`--load-format dummy`), generated lazily per tensor.
    Norm weights (1-D) are centred on 1 so activations stay in range; tensors of quantized Linears
    (INT4 packed words, FP8 bytes, their scales) come in their stored dtypes (quant/dummy.py)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], seed: int = 0, std: float = 0.02) -> None:
        self.shapes = dict(shapes)
        self.seed, self.std = seed, std

    def names(self) -> Iterable[str]:
        return self.shapes.keys()

    def kind(self, name: str) -> str:
        """The safetensors dtype the tensor stands for ("F32" for the plain float tensors)."""
        from ..quant.dummy import quantized_kind
        return quantized_kind(name, self.shapes) or "F32"

    def get(self, name: str) -> np.ndarray:
        rng = np.random.default_rng([self.seed, stable_hash(name)])
        shape = self.shapes[name]
        if self.kind(name) != "F32":
            from ..quant.dummy import dummy_quantized
            return dummy_quantized(name, self.shapes, rng)
        if len(shape) == 1:
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (self.std * rng.standard_normal(shape, dtype=np.float32))

    def raw(self, name: str) -> tuple[str, tuple[int, ...], np.ndarray]:
        return self.kind(name), self.shapes[name], self.get(name)


def stable_hash(name: str) -> int:
    h = 0
    for ch in name.encode():
        h = (h * 131 + ch) % (1 << 61)
    return h


def save_safetensors(path: str | Path, shapes: Mapping[str, tuple[int, ...]], get: Callable[[str], np.ndarray],
                     dtype: str = "BF16", kind_of: Callable[[str], str] | None = None) -> None:
    """Write tensors as one safetensors file, float ones in `dtype` (BF16, F16 or F32), fetching and writing one
    tensor at a time so a multi-GB checkpoint never sits in memory whole. `kind_of(name)` (DummyWeights.kind):
    "F32" for a float tensor, written in `dtype`, or the tensor's own dtype ("I32", "F8_E4M3": its values written as
    they are; "BF16": bf16 whatever `dtype` says)."""
    names = sorted(shapes)
    kinds = {n: k if (k := kind_of(n) if kind_of else "F32") != "F32" else dtype for n in names}
    header, offset = {}, 0
    for name in names:
        size = int(np.prod(shapes[name])) * _ITEMSIZE[kinds[name]]
        header[name] = {"dtype": kinds[name], "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            f.write(_tensor_bytes(get(name), kinds[name]))


_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}


def _tensor_bytes(arr: np.ndarray, kind: str) -> bytes:
    if kind == "BF16":  # bf16 arrays (ml_dtypes, or raw uint16 bit patterns) are written as they are
        return (arr.view(np.uint16) if arr.dtype.name in ("bfloat16", "uint16") else f32_to_bf16(arr)).tobytes()
    if kind in ("F16", "F32"):
        return np.ascontiguousarray(arr, dtype=np.float16 if kind == "F16" else np.float32).tobytes()
    return np.ascontiguousarray(arr, dtype=_DTYPES[kind]).tobytes()
