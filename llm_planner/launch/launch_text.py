"""What `launch` prints: the rank table, a run's result against its prediction, and notes on ranks that
share cores."""

from __future__ import annotations

import logging

from llm_planner.core.fmt import fmt_s
from llm_planner.launch.launch_types import LaunchResult
from llm_planner.runtime.table import RankTable

log = logging.getLogger(__name__)


def format_rank_table(table: RankTable) -> str:
    rows = [("rank", "host", "device", "torch", "tasks")]
    for r in table.ranks:
        torch_dev = f"cuda:{r.gpu_index}" if r.device_type == "gpu" else "cpu"
        tasks = (
            "; ".join(f"shard {s}: {_compact(t)}" for s, t in r.tasks.items())
            if len(r.tasks) > 1
            else _compact(next(iter(r.tasks.values()), []))
        )
        device = r.device if not r.group else f"{r.device} (group {r.plan_device})"
        rows.append((str(r.rank), r.hostname, device, torch_dev, tasks))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


def describe_result(result: LaunchResult) -> str:
    """What the CLI prints: the command and rank table (dry run), else the outcome of the run."""
    if result.dry_run:
        return f"{result.command_line}\n\n{format_rank_table(result.rank_table)}"
    if not result.ok:
        return f"launch failed: {result.error}"
    return "\n".join(_run_summary(result.report or {}, result))


def _run_summary(r: dict, result: LaunchResult) -> list[str]:
    n = result.rank_table.world_size
    lines = [f"ran {n} rank{'s' if n != 1 else ''} in {result.duration_s:.1f} s; report: {result.report_path}"]
    per = " per sample" if r.get("unit") == "s/sample" else ""
    predicted, measured = float(r.get("predicted_s", 0.0)), float(r.get("measured_s", 0.0))
    error = f" ({100 * (measured - predicted) / predicted:+.1f}%)" if predicted > 0 else ""
    lines.append(
        f"{r.get('measured_what', 'measured')}: measured {fmt_s(measured)}{per}, "
        f"predicted {fmt_s(predicted)}{per}{error}"
    )
    if r.get("measured_samples_per_s"):
        decoder = result.rank_table.run.workload == "decoder"
        decode, batches = (" = tokens/s in decode", "in flight") if decoder else ("", "streamed")
        lines.append(
            f"steady state: {r['measured_samples_per_s']:.1f} samples/s{decode} "
            f"(predicted {r.get('predicted_samples_per_s') or 0:.1f}), {r.get('batches', 1)} batches {batches}"
        )
    if "tokens" in r:
        lines.append(
            f"whole generation: {fmt_s(r.get('wall_s', 0.0))}, "
            f"{r.get('tokens_per_s', 0.0):.1f} tokens/s (prefill included)"
        )
        if r.get("weights") != "checkpoint":
            lines.append(
                "weights: seeded random, not a checkpoint (pass --checkpoint DIR for real weights): "
                "the tokens are not text"
            )
        lines += [f"request {i}: {' '.join(map(str, t))}" for i, t in enumerate(r["tokens"])]
    elif "output" in r:
        lines.append(
            f"output {r['output']['shape']} sha256 {r['output']['sha256'][:16]}... saved to {r['output_path']}"
        )
    lines.append(f"runtime overhead {100 * r.get('overhead_fraction', 0.0):.1f}% of the ranks' time")
    for device in r.get("gpu_fell_back_to_cpu", []):
        lines.append(f"warning: {device} is a GPU but CUDA is not available on its host: its rank ran on the CPU")
    return lines + held_batches_notes(r) + oversubscription_notes(r.get("ranks", []))


def held_batches_notes(report: dict) -> list[str]:
    """A note when a streamed graph run's ranks held the values of more batches at once than the plan keeps in
    flight, the count its memory check counted (llm_planner.runtime.graph_run, "Memory")."""
    planned = report.get("plan_batches_in_flight")
    held = max((r.get("most_batches_held", 0) for r in report.get("ranks", [])), default=0)
    if not planned or held <= planned:
        return []
    return [
        f"note: a rank held the values of {held} batches at once, more than the {planned} in flight the plan's "
        "memory check counts: the run's wavefront order keeps a value until its reader's turn (docs/measure.md)"
    ]


def oversubscription_notes(ranks: list[dict]) -> list[str]:
    """A warning for each host that ran more ranks than it has cores: its times are not the plan's devices' times."""
    notes = {}
    for r in ranks:
        if r.get("wait") == "sleep":
            host = r["device"].split("/")[0]
            notes[host] = (
                f"warning: node {host} ran {r['ranks_on_host']} ranks on {r['host_cores']} cores: ranks shared cores "
                f"and waiting ranks slept between polls, so measured times include waking them; "
                f"describe at most one single-thread CPU device per core to compare with the plan"
            )
    return list(notes.values())


def _compact(tasks: list[str]) -> str:
    return ", ".join(tasks) if len(tasks) <= 6 else f"{', '.join(tasks[:3])}, ... {tasks[-1]} ({len(tasks)} tasks)"
