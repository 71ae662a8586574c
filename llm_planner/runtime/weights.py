"""Where a rank's parameters come from: a fixed seed or a local checkpoint.

Both sources fill a module's parameters by their *full* names in the whole
Hugging Face model ("transformer.h.3.attn.c_attn.weight"), so a rank that builds
only block 3 gets exactly the tensors that block has in the whole model:

- `SeededWeights`: every parameter is drawn from its own generator, seeded by
  (seed, crc32 of its full name); matrices ~ N(0, std^2), biases 0, other
  vectors (norm scales) 1. No rank ever builds the whole model, yet all ranks
  and a whole model initialised with `init_whole_model_` agree bit for bit.
- `CheckpointWeights`: a Hugging Face checkpoint directory (`model.safetensors`
  or a sharded `model.safetensors.index.json`); a rank opens only the files that
  hold its tensors and reads only those tensors.

A tensor-parallel member reads slices: `tensor_slice(name, shape, dim, start,
stop)` is rows or columns [start, stop) along `dim` of the full tensor `shape`.
A checkpoint reads only those bytes (safetensors slices); the seeded source
draws the full tensor from its generator and keeps the slice (the values must be
those of the whole model's tensor, and a generator cannot skip ahead).

A sharded checkpoint's index is read by llm_planner.core.fileio (a regular file, size
limits); its shard names must be relative paths that stay inside the checkpoint
directory (no absolute path, no `..`), and every shard named must be a regular
file there (a FIFO never blocks a rank). Links inside the directory are followed
(a Hugging Face cache links snapshots to its blobs).

Tied weights (an LM head that shares the embedding matrix) are read under the
name of the tensor they are tied to; `aliases` maps one to the other.
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path, PurePosixPath

import torch

from llm_planner.core.fileio import read_document


class WeightsError(ValueError):
    """A checkpoint that lacks a tensor, or holds one of the wrong shape."""


class SeededWeights:
    def __init__(self, *, seed: int, std: float, aliases: dict[str, str] | None = None):
        self.seed, self.std, self.aliases = int(seed), float(std), dict(aliases or {})
        self.tensors_read: list[str] = []

    thread_safe = True  # each tensor its own generator: any order, any thread, the same values

    def summary(self) -> dict:
        return {"source": "seed", "seed": self.seed, "tensors": len(self.tensors_read)}

    def tensor(self, name: str, shape: torch.Size) -> torch.Tensor:
        name = self.aliases.get(name, name)
        self.tensors_read.append(name)
        if name.endswith("bias"):
            return torch.zeros(shape)
        if len(shape) < 2:
            return torch.ones(shape)
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))
        return torch.randn(shape, generator=generator) * self.std

    def tensor_slice(self, name: str, shape: torch.Size, dim: int, start: int, stop: int) -> torch.Tensor:
        return self.tensor(name, shape).narrow(dim, start, stop - start).clone()


def _weight_map(directory: Path, index: Path) -> dict[str, Path]:
    """Tensor name -> shard file of a sharded checkpoint (the module docstring's rules)."""
    data = read_document(index, WeightsError)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise WeightsError(f"{index}: weight_map: expected a mapping of tensor name to shard file")
    out, shards = {}, {}
    for name, shard in weight_map.items():
        if shard not in shards:
            parts = PurePosixPath(shard).parts if isinstance(shard, str) else ()
            if not parts or PurePosixPath(shard).is_absolute() or ".." in parts or "\\" in shard:
                raise WeightsError(
                    f"{index}: weight_map.{name}: {shard!r} is not a file name inside the checkpoint directory"
                )
            shards[shard] = directory.joinpath(*parts)
            _check_regular(shards[shard], index)
        out[name] = shards[shard]
    return out


def _check_regular(path: Path, source: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise WeightsError(f"{source}: {path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise WeightsError(f"{source}: {path}: not a regular file")


class CheckpointWeights:
    def __init__(self, directory: str | Path, *, aliases: dict[str, str] | None = None):
        self.directory = Path(directory)
        self.aliases = dict(aliases or {})
        index = self.directory / "model.safetensors.index.json"
        single = self.directory / "model.safetensors"
        if index.exists():
            self.file_of = _weight_map(self.directory, index)
        elif single.exists():
            _check_regular(single, single)
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as f:
                self.file_of = {k: single for k in f.keys()}
        else:
            raise WeightsError(
                f"{self.directory}: no model.safetensors or model.safetensors.index.json "
                "(only safetensors checkpoints are read)"
            )
        self._open: dict[Path, object] = {}
        self.files_read: set[str] = set()
        self.tensors_read: list[str] = []

    def summary(self) -> dict:
        return {"source": "checkpoint", "tensors": len(self.tensors_read), "files": sorted(self.files_read)}

    def _handle(self, name: str) -> tuple[str, object]:
        from safetensors import safe_open

        key = name if name in self.file_of else self.aliases.get(name, name)
        if key not in self.file_of:
            raise WeightsError(f"{self.directory}: checkpoint has no tensor {name!r}")
        path = self.file_of[key]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
            self.files_read.add(path.name)
        self.tensors_read.append(key)
        return key, self._open[path]

    def _check_shape(self, key: str, got, shape) -> None:
        if tuple(got) != tuple(shape):
            raise WeightsError(
                f"{self.directory}: tensor {key!r} has shape {tuple(got)}, the model expects {tuple(shape)}"
            )

    def tensor(self, name: str, shape: torch.Size) -> torch.Tensor:
        key, handle = self._handle(name)
        value = handle.get_tensor(key)  # type: ignore[attr-defined]
        self._check_shape(key, value.shape, shape)
        return value

    def tensor_slice(self, name: str, shape: torch.Size, dim: int, start: int, stop: int) -> torch.Tensor:
        """Read only rows / columns [start, stop) along `dim` (a safetensors slice)."""
        key, handle = self._handle(name)
        part = handle.get_slice(key)  # type: ignore[attr-defined]
        self._check_shape(key, part.get_shape(), shape)
        index = tuple(slice(start, stop) if d == dim else slice(None) for d in range(len(shape)))
        return part[index]

    def close(self) -> None:
        self._open.clear()


def fill_module_(
    module: torch.nn.Module, prefix: str, source, *, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module:
    """Give every parameter of `module` (named `prefix` in the whole model) its value from `source`.

    A module built on the meta device gets its storage here (its parameters are
    all overwritten, so their initial values never matter); it must have no
    buffers, which would stay uninitialised.
    """
    if any(p.is_meta for p in module.parameters()):
        assert not any(True for _ in module.buffers()), f"{prefix}: a meta-built module with buffers"
        module.to_empty(device=device)
    module.to(device=device, dtype=dtype)
    with torch.no_grad():
        for local, param in module.named_parameters():
            full = f"{prefix}.{local}" if prefix else local
            param.copy_(source.tensor(full, param.shape).to(dtype=dtype))
    return module.eval()


def init_whole_model_(model: torch.nn.Module, source) -> torch.nn.Module:
    """Fill a whole model the way ranks fill their parts (the reference for tests)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(source.tensor(name, param.shape).to(param.dtype))
    return model.eval()
