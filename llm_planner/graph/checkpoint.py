"""What a checkpoint's config.json says of its precision: the activations' dtype (`torch_dtype`, or
`dtype` in newer transformers) and the weights' format (`quantization_config`), as the formats of
llm_planner.core.precision.

    quant_method  bits  planned as
    awq           4     int4-awq with its group_size
    gptq          4     int4-gptq with its group_size (-1, one group per row: the hidden size)
    fp8           -     fp8 (W8A8)

Any other method, or other bits, is refused naming the file and the field: the planner would
otherwise plan a format the checkpoint is not in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_planner.core.fileio import parse_document, read_text
from llm_planner.graph.hf_config import config_file_of
from llm_planner.graph.ir import GraphError

TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
METHODS = {"awq": "int4-awq", "gptq": "int4-gptq", "fp8": "fp8"}


@dataclass(frozen=True, kw_only=True)
class CheckpointPrecision:
    """A config.json's precision fields (None: the file does not say)."""

    source: str  # the config.json
    dtype: str | None  # torch_dtype as ours (fp16, bf16, fp32)
    weights: str | None  # a weight format of llm_planner.core.precision, when quantization_config names one
    group_size: int | None  # int4 formats' group

    @property
    def weights_label(self) -> str | None:
        """The weight format as `--weights` writes it."""
        if self.weights is None:
            return None
        return f"{self.weights}:g{self.group_size}" if self.group_size is not None else self.weights


def checkpoint_precision(model: str) -> CheckpointPrecision | None:
    """The precision the config.json of `model` (a file or a directory holding one) states; None for
    a preset's name. GraphError naming the file and field for a quantization it cannot plan."""
    path = config_file_of(model)
    if path is None:
        return None
    data = parse_document(read_text(path, GraphError), str(path), GraphError, as_json=True, finite=True)
    if not isinstance(data, dict):
        raise GraphError(f"{path}: expected a JSON object at the top level")
    dtype = _dtype(data, str(path))
    quant = data.get("quantization_config")
    if quant is None:
        return CheckpointPrecision(source=str(path), dtype=dtype, weights=None, group_size=None)
    weights, group = _quantization(quant, data, str(path))
    return CheckpointPrecision(source=str(path), dtype=dtype, weights=weights, group_size=group)


def _dtype(data: dict, source: str) -> str | None:
    """The weights' dtype the config states (`torch_dtype`, or `dtype` in newer transformers); None
    where it states none or "auto" (the weights' own); GraphError for one the planner does not know."""
    key = "torch_dtype" if "torch_dtype" in data else "dtype"
    value = data.get(key)
    if value is None or value == "auto":
        return None
    if not isinstance(value, str) or value not in TORCH_DTYPES:
        raise GraphError(f"{source}: {key}: {value!r} is not planned (planned: {', '.join(TORCH_DTYPES)}, or auto)")
    return TORCH_DTYPES[value]


def _quantization(quant: Any, data: dict, source: str) -> tuple[str, int | None]:
    where = f"{source}: quantization_config"
    if not isinstance(quant, dict):
        raise GraphError(f"{where}: expected a JSON object")
    method = quant.get("quant_method")
    if method not in METHODS:
        raise GraphError(f"{where}.quant_method: {method!r} is not planned (planned: {', '.join(METHODS)})")
    if method == "fp8":
        return "fp8", None
    bits = quant.get("bits", quant.get("w_bit"))
    if bits != 4 or isinstance(bits, bool):
        raise GraphError(f"{where}.bits: {bits!r}: {method} is planned at 4 bits only (int4-{method})")
    group = quant.get("group_size", quant.get("q_group_size"))
    if group == -1:  # one group per row: a row of the hidden size (the input width of most projections)
        group = data.get("hidden_size", data.get("n_embd"))
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise GraphError(f"{where}.group_size: {group!r}: expected a positive integer or -1")
    return METHODS[method], group
