"""The request lengths Helix's offline runs draw from (docs/helix.md, "The engine, replayed").

Helix's feeder draws each query's (prompt, output) pair from the Azure Conversation trace:
`simulator/trace_generator/length_data/azure_conv_input.pkl` and `azure_conv_output.pkl` (16,657
pairs, prompts 7-2,047 tokens, outputs 7-1,000), a pair by index with Python's `random.randint`
after `random.seed(0)`. `load_helix_lengths` reads the two lists with an unpickler that refuses
every global, so nothing in the files is run: a pickle of anything but a list of integers is
refused. `find_helix_lengths` looks for them in the Helix checkout a model manager folder is in.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

from llm_planner.helix.inputs import HelixError

MAX_PAIRS = 10_000_000
MAX_TOKENS = 1_000_000
MAX_FILE_BYTES = 64 * 2**20  # Helix's files are 40-47 KB; checked before anything is read
_FILES = ("azure_conv_input.pkl", "azure_conv_output.pkl")


@dataclass(frozen=True)
class Lengths:
    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    source: str

    @property
    def means(self) -> tuple[float, float]:
        return sum(self.prompts) / len(self.prompts), sum(self.outputs) / len(self.outputs)


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):  # noqa: ARG002 (every global refused: nothing is run)
        raise pickle.UnpicklingError("refers to code, not data")


def find_helix_lengths(profiles_dir: str | Path) -> Path | None:
    """The trace's folder of the Helix checkout holding `profiles_dir` (simulator/model_manager/<model>), or None."""
    folder = Path(profiles_dir).resolve().parent.parent / "trace_generator" / "length_data"
    return folder if all((folder / name).is_file() for name in _FILES) else None


def load_helix_lengths(folder: str | Path) -> Lengths:
    """The trace's (prompt, output) pairs from Helix's length files (module docstring)."""
    prompts, outputs = (_int_list(Path(folder) / name) for name in _FILES)
    if len(prompts) != len(outputs):
        raise HelixError(f"{folder}: {_FILES[0]} holds {len(prompts):,} lengths and {_FILES[1]} {len(outputs):,}")
    return Lengths(tuple(prompts), tuple(outputs), source=str(folder))


def _int_list(path: Path) -> list[int]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise HelixError(
                f"{path}: {path.stat().st_size:,} bytes, past the {MAX_FILE_BYTES:,} a length file may hold"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise HelixError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        value = _DataOnly(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 (any malformed pickle: named, never a traceback)
        raise HelixError(f"{path}: not a pickled list of token counts ({type(exc).__name__}: {exc})") from None
    ok = isinstance(value, list) and 0 < len(value) <= MAX_PAIRS
    if not ok or not all(type(v) is int and 1 <= v <= MAX_TOKENS for v in value):
        raise HelixError(f"{path}: expected a list of 1 to {MAX_PAIRS:,} token counts in 1..{MAX_TOKENS:,}")
    return value
