"""Precision of a served model: the weights' format, the activations' dtype and the KV cache's
dtype, and what each format costs: its bytes per element and the dtype its matrix products run at.

Weight formats (`--weights`, a checkpoint's `quantization_config`):

    format      bytes per weight                 linear layers compute at
    fp32/fp16/  the dtype's (2 or 4)             the activation dtype (the format *is* the
    bf16                                         activation dtype: unquantized weights)
    fp8         1 (W8A8, e4m3)                   fp8 tensor cores; on a GPU without them but with
                                                 bf16 (Ampere: vLLM's FP8 Marlin), W8A16: the
                                                 activation dtype, times `dequant_factor`
    int8        1 (W8A8, SmoothQuant-style)      int8 tensor cores
    int4-awq    1/2 + (2 + 1/2) / g              the activation dtype (W4A16: weights dequantized
    int4-gptq   1/2 + (2 + 1/2) / g              in registers), times the kind's `dequant_factor`

with g the group size (weights per scale and zero point, 128 by default, `int4-awq:g64` for
another): each group of g 4-bit weights carries one 16-bit scale and one 4-bit zero point (AWQ's
and GPTQ's packed `qzeros` and fp16 `scales`; Marlin's own cost model, IST-DASLab/marlin, counts
the same scale bytes). A checkpoint's per-channel group (`group_size: -1`) is planned as one group
per row of the hidden size. The per-tensor or per-channel fp32 scales of fp8 and int8 (one number
per output row: under 0.1% of the bytes for rows of 1,024 weights and more) and GPTQ's act-order
index are left out. Only the decoder layers' linear weights take the format: embeddings, norms,
biases and the LM head stay in the activation dtype, as AWQ, GPTQ and vLLM's fp8 leave them.

The KV cache is the activation dtype ("auto") or fp8 (1 byte per element; attention dequantizes
it and computes in the activation dtype).

Which device kinds run a precision is `runs_on` (docs/cluster-spec.md): a kind runs int8 weights
when its `peak_flops` gives int8 (the rate the linear layers run at), fp8 weights when they give fp8
(W8A8) or, on a `gpu` kind with fp16 or bf16 activations, bf16 (weight-only W8A16: FP8 Marlin
needs an NVIDIA GPU of compute capability 8.0, which a bf16 peak marks; V100 and T4 have neither;
`linear_dtype` says which), int4 formats
and fp8 KV on every GPU and accelerator kind (weight-only kernels dequantize in registers: AWQ,
GPTQ and Marlin kernels need only fp16 tensor cores), and on CPU kinds only unquantized weights
and KV: the planner's own runtime computes in one dtype on CPUs, so a CPU kind is not eligible for
the stages of a quantized plan (the search leaves it out; docs/serving.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.core.constants import DTYPE_BYTES

ACTIVATION_DTYPES = ("fp32", "fp16", "bf16")
WEIGHT_ONLY_FORMATS = ("int4-awq", "int4-gptq")  # W4A16: computed at the activation dtype
COMPUTE_FORMATS = ("fp8", "int8")  # W8A8: computed at the format's own tensor-core rate
WEIGHT_FORMATS = (*ACTIVATION_DTYPES, *COMPUTE_FORMATS, *WEIGHT_ONLY_FORMATS)
KV_FORMATS = ("auto", "fp8")  # auto: the activation dtype
DEFAULT_GROUP_SIZE = 128
DEFAULT_DTYPE = "fp16"  # activations when neither --dtype nor the model's config names a dtype
SCALE_BYTES = 2.0  # one fp16 scale per group
ZERO_BYTES = 0.5  # one 4-bit zero point per group
LEGACY_DTYPES = ("fp8",)  # plan files of version 5: `model.dtype: fp8` was fp8 weights, activations and KV


class PrecisionError(ValueError):
    """A precision that means nothing (an unknown format, a bad group size); the message names the
    flag or field it came from."""


@dataclass(frozen=True, kw_only=True)
class Precision:
    """What one replica's model runs in (module docstring)."""

    weights: str  # one of WEIGHT_FORMATS; the activation dtype when the weights are not quantized
    activations: str  # one of ACTIVATION_DTYPES (LEGACY_DTYPES only from version-5 plans)
    kv_cache: str  # the activation dtype or fp8
    group_size: int | None = None  # int4 formats: weights per scale and zero point; None otherwise

    def __post_init__(self) -> None:
        if self.activations not in (*ACTIVATION_DTYPES, *LEGACY_DTYPES):
            raise PrecisionError(
                f"activation dtype {self.activations!r}: expected one of {', '.join(ACTIVATION_DTYPES)}"
            )
        if self.weights not in WEIGHT_FORMATS:
            raise PrecisionError(f"weight format {self.weights!r}: expected one of {', '.join(WEIGHT_FORMATS)}")
        if self.weights in ACTIVATION_DTYPES and self.weights != self.activations:
            raise PrecisionError(
                f"weights {self.weights} with activations {self.activations}: "
                "unquantized weights are the activation dtype"
            )
        if self.kv_cache not in (self.activations, "fp8"):
            raise PrecisionError(f"KV cache dtype {self.kv_cache!r}: expected {self.activations} (auto) or fp8")
        if (self.group_size is not None) != (self.weights in WEIGHT_ONLY_FORMATS):
            raise PrecisionError(f"weight format {self.weights}: a group size goes with int4 formats only")
        if self.group_size is not None and (isinstance(self.group_size, bool) or self.group_size < 1):
            raise PrecisionError(f"weight format {self.weights}: group size must be a positive integer")

    @property
    def quantized(self) -> bool:
        """Whether anything is stored below the activation dtype (weights or KV)."""
        return self.weights != self.activations or self.kv_cache != self.activations

    @property
    def weight_only(self) -> bool:
        return self.weights in WEIGHT_ONLY_FORMATS

    @property
    def compute_dtype(self) -> str:
        """The dtype whose peak FLOP/s the linear layers run at (module docstring)."""
        return self.weights if self.weights in COMPUTE_FORMATS else self.activations

    @property
    def weight_bytes(self) -> float:
        """Bytes per linear weight, scales and zero points included (module docstring)."""
        if self.group_size is not None:
            return 0.5 + (SCALE_BYTES + ZERO_BYTES) / self.group_size
        return float(DTYPE_BYTES[self.weights])

    @property
    def activation_bytes(self) -> int:
        return DTYPE_BYTES[self.activations]

    @property
    def kv_bytes(self) -> int:
        """Bytes per KV cache element."""
        return DTYPE_BYTES[self.kv_cache]

    @property
    def weights_label(self) -> str:
        """The weight format as `--weights` writes it (int4 formats with their group size)."""
        return f"{self.weights}:g{self.group_size}" if self.group_size is not None else self.weights

    def describe(self) -> str:
        return f"weights {self.weights_label}, activations {self.activations}, KV cache {self.kv_cache}"

    def to_dict(self) -> dict[str, str]:
        return {"weights": self.weights_label, "activations": self.activations, "kv_cache": self.kv_cache}


def uniform(dtype: str) -> Precision:
    """Everything in one dtype: what a plain `--dtype` and a version-5 plan's `model.dtype` mean."""
    return Precision(weights=dtype, activations=dtype, kv_cache=dtype)


def as_precision(value: str | Precision) -> Precision:
    return value if isinstance(value, Precision) else uniform(value)


def parse_weights(text: str, where: str) -> tuple[str, int | None]:
    """`--weights` text: a format, an int4 format with `:gN` for its group size; (format, group)."""
    name, _, group = text.partition(":")
    if name not in WEIGHT_FORMATS:
        raise PrecisionError(f"{where} {text}: unknown weight format (known: {', '.join(WEIGHT_FORMATS)})")
    if name not in WEIGHT_ONLY_FORMATS:
        if group:
            raise PrecisionError(f"{where} {text}: only int4 formats take a group size (:gN)")
        return name, None
    if not group:
        return name, DEFAULT_GROUP_SIZE
    if not (group.startswith("g") and group[1:].isdigit() and int(group[1:]) > 0):
        raise PrecisionError(
            f"{where} {text}: the group size is written :gN with N a positive integer, e.g. {name}:g64"
        )
    return name, int(group[1:])


def build_precision(
    activations: str,
    weights: str | None,
    kv_cache: str | None,
    where: str = "--weights",
    kv_where: str = "--kv-cache-dtype",
) -> Precision:
    """The precision of `--dtype`, `--weights` (None: the activation dtype) and `--kv-cache-dtype`
    (None or auto: the activation dtype); PrecisionError naming the flag."""
    if activations not in ACTIVATION_DTYPES:
        raise PrecisionError(
            f"--dtype {activations}: serving activations are one of {', '.join(ACTIVATION_DTYPES)}; "
            "fp8 weights and KV cache are --weights fp8 --kv-cache-dtype fp8"
        )
    name, group = parse_weights(weights, where) if weights else (activations, None)
    if name in ACTIVATION_DTYPES and name != activations:
        raise PrecisionError(f"{where} {name}: unquantized weights are the activation dtype (--dtype {activations})")
    if kv_cache not in (None, *KV_FORMATS):
        raise PrecisionError(f"{kv_where} {kv_cache}: expected one of {', '.join(KV_FORMATS)}")
    kv = activations if kv_cache in (None, "auto") else kv_cache
    return Precision(weights=name, activations=activations, kv_cache=kv, group_size=group)


def fp8_weight_only(precision: Precision, peak_dtypes: tuple[str, ...]) -> bool:
    """Whether a kind whose peak_flops give `peak_dtypes` would run the precision's weights as fp8
    weight-only kernels (W8A16): fp8 weights and no fp8 peak (`runs_on` says whether it can)."""
    return precision.weights == "fp8" and "fp8" not in peak_dtypes


def linear_dtype(precision: Precision, peak_dtypes: tuple[str, ...]) -> tuple[str, bool]:
    """(the dtype whose peak a kind whose peak_flops give `peak_dtypes` runs the linear layers at,
    whether its kernels dequantize the weights: weight-only), for a kind that runs the precision
    (`runs_on`): fp8 weight-only at the activation dtype (module docstring), every other format as
    Precision.compute_dtype says."""
    if fp8_weight_only(precision, peak_dtypes):
        return precision.activations, True
    return precision.compute_dtype, precision.weight_only


def runs_on(precision: Precision, kind_type: str, peak_dtypes: tuple[str, ...]) -> str | None:
    """Why a device kind (its type and the dtypes its peak_flops gives) cannot run `precision`, or
    None when it can (module docstring)."""
    if kind_type == "cpu" and precision.quantized:
        return "CPU kinds run unquantized weights and KV cache only"
    dtype, _ = linear_dtype(precision, peak_dtypes)
    if dtype not in peak_dtypes:
        return f"its peak_flops give no {dtype}"
    if fp8_weight_only(precision, peak_dtypes) and (kind_type != "gpu" or "bf16" not in peak_dtypes):
        return (
            "its peak_flops give no fp8, and fp8 weight-only kernels (FP8 Marlin) run on GPUs of compute capability "
            "8.0 or later only (a gpu kind with a bf16 peak)"
        )
    if fp8_weight_only(precision, peak_dtypes) and precision.activations not in ("fp16", "bf16"):
        return (
            f"its peak_flops give no fp8, and fp8 weight-only kernels (FP8 Marlin) compute in fp16 or bf16, not {dtype}"
        )
    return None


PRECISION_KEYS = ("weights", "activations", "kv_cache")


def precision_from_dict(data: dict, where: str) -> Precision:
    """A plan file's `precision` mapping (Precision.to_dict) back; PrecisionError naming `where`."""
    name, group = parse_weights(str(data["weights"]), f"{where}.weights")
    try:
        return Precision(weights=name, activations=data["activations"], kv_cache=data["kv_cache"], group_size=group)
    except PrecisionError as exc:
        raise PrecisionError(f"{where}: {exc}") from None
