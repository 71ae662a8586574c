"""What a calibration found, and the corrected cluster spec it writes.

Both calibrations (placement runs: llm_planner.measure.calibrate; serving measurements:
llm_planner.measure.serving_fit) give one `Fit` per device kind or link class: the values fitted
or kept, and why a field was kept. `write_calibrated_spec` writes the input spec with the fitted
fields replaced (or added), comments and layout kept (llm_planner.measure.spec_edit), after
checking that the result loads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from llm_planner.core.atomic import write_atomic
from llm_planner.core.spec import ClusterSpec, parse_cluster
from llm_planner.measure.spec_edit import EditError, dump_with_fields, set_fields

log = logging.getLogger(__name__)


class CalibrateError(ValueError):
    """Runs that cannot be fitted (bad pairing of plans and reports, unknown devices); names the file and field."""


@dataclass(frozen=True, kw_only=True)
class Fit:
    """The fitted (or kept) values of one device kind or link class."""

    name: str  # kind name, or the link class's path in the spec ("links.intra_node_default")
    path: tuple[str | int, ...]  # where its fields live in the spec YAML
    values: dict[str, float]  # field -> value (fitted or kept)
    before: dict[str, float]  # field -> the spec's value
    fitted: tuple[str, ...]  # fields fitted from the data
    kept: dict[str, str]  # field -> why it keeps the spec's value
    samples: int  # observations used
    rel_rms_before: float  # RMS of relative residuals with the spec's values
    rel_rms_after: float


@dataclass(frozen=True, kw_only=True)
class Calibration:
    kinds: tuple[Fit, ...]
    links: tuple[Fit, ...] = ()

    def fields(self) -> dict[tuple[str | int, ...], float]:
        """Spec path -> new value, for every fitted field."""
        return {(*f.path, name): f.values[name] for f in (*self.kinds, *self.links) for name in f.fitted}


def human(field: str, value: float) -> float | str:
    """The value as the spec's loader reads it, rounded to 4 significant digits."""
    if field.endswith("_bytes_per_s"):
        return f"{value / 1e9:.4g} GB/s"
    if field.endswith("_s"):
        return f"{value * 1e6:.4g} us"
    return float(f"{value:.4g}")


def write_calibrated_spec(
    cluster_path: str | Path, calibration: Calibration, output: str | Path, *, sources: Sequence[str]
) -> ClusterSpec:
    """The spec at `cluster_path` with the fitted fields replaced (comments and layout kept), written to `output`."""

    text = Path(cluster_path).read_text()
    fields = {path: human(str(path[-1]), value) for path, value in calibration.fields().items()}
    try:
        body = set_fields(text, fields)
    except EditError as exc:
        log.warning("%s: cannot edit in place (%s); writing it anew without its comments", cluster_path, exc)
        body = dump_with_fields(text, fields)
    lines = [f"# Calibrated by `llm-planner calibrate` from {', '.join(sources)}:"]
    for fit in (*calibration.kinds, *calibration.links):
        changes = ", ".join(f"{name} {fit.before[name]:.4g} -> {fit.values[name]:.4g}" for name in fit.fitted)
        lines.append(f"#   {fit.name}: {changes or 'unchanged'} ({fit.samples} observations)")
    new_text = "\n".join(lines) + "\n" + body
    spec = parse_cluster(yaml.safe_load(new_text), source=str(output))  # what we write must load

    write_atomic(output, new_text, CalibrateError)
    return spec
