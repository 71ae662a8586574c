"""Helix (Mei et al., ASPLOS'25) cluster and profile files -> our cluster spec and serving profile.

Helix describes a cluster with two INI files (docs/helix.md has the details):
- the cluster file (`cluster24.ini`): `[NodeNames] total_compute_nodes=N`, one
  `[ComputeNode-i]` per machine with its `type=` (a machine type name), and `[Link-a-b]`
  sections with `bandwidth=` and `latency=` for each pair (a, b are node indices,
  `source` or `sink`: the coordinator);
- the machine profile file (`machine_profiles.ini`, beside it by default): per machine
  type, `vram_size`, `inbound_nic_speed`, `outbound_nic_speed`, `disk_speed`.
Values are written as `<number> * <unit>` (`10 * gbps`, `1 * MilliSec`, `16 * GB`).
Helix's unit constants are powers of 1000 with no bit/byte distinction (gbps = GB = 1e9),
and its simulator divides byte counts by them, so a link of `1000 * mbps` moves 1e9 bytes/s
there; we import what the simulator does (bytes/s = the number), not the nominal bit rate.

A machine type `T4x2` is two `T4` GPUs; the GPU's compute and memory bandwidth come from
llm_planner/core/data/gpu_datasheets.yaml, its memory is the machine's vram split evenly.

Our spec has one node template per machine type with `count` copies, in increasing Helix
index: copy i of template `t4` is the i-th `T4` machine of the file; on a geo-distributed
cluster (several regions, `find_regions`: machines joined by links much faster than the rest)
one template per machine type and region (`t4-r1`), each naming its region. `device_helix_names`
gives that map (our device name -> Helix simulator node name, `compute_node_<index + 2>`),
so a plan over the imported spec can be written back as a Helix layout
(llm_planner.helix.layout_file).

Helix has one link per pair of machines, and NICs shared by a node's links; our spec has one
link per pair of regions (llm_planner.helix.spec_yaml writes it): the slowest pair between the
two regions (the minimum over their compute-node pairs of min(link, sender's outbound NIC,
receiver's inbound NIC)) with the largest latency, inside a region the slowest pair inside it;
a cluster of one region has one link between nodes, its slowest pair. The YAML's comments say
so. Links to the coordinator are not imported.

Per-layer profiles: `<dir>/<type lowercased>/decode_bs2time.csv` and `prompt_bs2time.csv`,
rows `batch,milliseconds` for one decoder layer (decode: batch sequences, one token each;
prompt: batch = prompt tokens). `serving_profile_yaml` writes them in our serving profile
format (llm_planner.cost.serving_profile) in seconds. Profiles of multi-GPU machine types time a
tensor-parallel group, not one device of a kind, and are left out (with a comment).
"""

from __future__ import annotations

import configparser
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from llm_planner.core.fileio import read_document, read_text
from llm_planner.core.fmt import quote
from llm_planner.core.spec_fields import MAX_BANDWIDTH, MAX_FIXED_SECONDS, MIN_RATE
from llm_planner.graph.decoder_limits import MAX_SIZES

DATASHEETS = Path(__file__).resolve().parents[1] / "core" / "data" / "gpu_datasheets.yaml"
REGION_GAP = 10.0  # fast and slow pair bandwidths of one cluster differ by at least this factor (regions)
NODE_INDEX_OFFSET = 2  # Helix's simulator names ComputeNode-i of a cluster file compute_node_<i + 2>
# Limits on what Helix's files may hold (docs/inputs.md), checked where each number is read: machines
# of a cluster file (far past Helix's 42; plan-helix's search has its own, llm_planner.helix.plan),
# layers (a model's, graph.decoder_limits), a profile's batch or prompt tokens, a table's entries.
MAX_MACHINES = 1024
MAX_LAYERS = MAX_SIZES["num_layers"]
MAX_BATCH = 10**8
MAX_TABLE_VALUE = 10**9
MOST_LAYER_MS = 60_000.0  # a profile row's time: one layer of one batch, a minute at most
LEAST_LAYER_MS = 1e-6  # and a nanosecond at least, where it is not 0
HELIX_UNITS = {
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "Byte": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "Sec": 1.0,
    "MilliSec": 1e-3,
}
_VALUE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?:\*\s*([A-Za-z]+))?\s*$", re.ASCII)
_MACHINE_TYPE = re.compile(r"^(?P<gpu>.+?)(?:x(?P<count>\d+))?$", re.ASCII)


class HelixError(ValueError):
    """A Helix file that cannot be imported; the message names the file and the section or field."""


@dataclass(frozen=True, kw_only=True)
class HelixMachineType:
    name: str  # Helix's name ("T4x2")
    gpu: str  # the GPU ("T4")
    num_gpus: int
    vram_bytes: float  # the whole machine
    inbound_nic_bytes_per_s: float
    outbound_nic_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class HelixLink:
    a: str  # node index as text, "source" or "sink"
    b: str
    bw_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True, kw_only=True)
class HelixCluster:
    source: str  # the cluster file
    machine_types: tuple[HelixMachineType, ...]  # those the nodes use
    node_types: tuple[str, ...]  # machine type of ComputeNode-i, by i
    links: tuple[HelixLink, ...]
    # the coordinator's NICs (SourceNode's outbound, SinkNode's inbound) when the profiles state them
    coordinator_nics: tuple[float, float] | None = None

    def machine_type(self, name: str) -> HelixMachineType:
        return next(m for m in self.machine_types if m.name == name)


def helix_node_name(index: int) -> str:
    """The simulator's (and layout file's) name of ComputeNode-`index` of a cluster file."""
    return f"compute_node_{index + NODE_INDEX_OFFSET}"


def helix_node_index(name: str) -> int:
    """The ComputeNode index of a simulator node name (helix_node_name's inverse)."""
    return int(name.rsplit("_", 1)[1]) - NODE_INDEX_OFFSET


def parse_helix_value(text: str) -> float:
    """`10 * gbps` -> 1e10; `-1` -> -1.0 (Helix's "unlimited"). ValueError for anything else."""
    match = _VALUE.match(text)
    if not match or (match.group(2) and match.group(2) not in HELIX_UNITS):
        raise ValueError(f"cannot read {text!r} as '<number> * <unit>' (units: {', '.join(HELIX_UNITS)})")
    value = float(match.group(1)) * (HELIX_UNITS[match.group(2)] if match.group(2) else 1.0)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def bounded_int(text: str, low: int, high: int) -> int:
    """The decimal integer `text` if it lies in [low, high]; ValueError saying why. A number of
    thousands of digits is refused by its length, never converted."""
    digits = text.strip()
    if not re.fullmatch(r"[-+]?[0-9]+", digits):
        raise ValueError(f"expected an integer, got {quote(text)}")
    if len(digits.lstrip("+-").lstrip("0")) > len(str(high)) or not low <= int(digits) <= high:
        raise ValueError(f"{quote(digits)} is outside [{low:,}, {high:,}], the range it may take (docs/inputs.md)")
    return int(digits)


class _Ini:
    """One INI file; every error names the file, the section and the field."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.parser = configparser.ConfigParser(interpolation=None)
        try:
            self.parser.read_string(read_text(path, HelixError), source=self.path)
        except configparser.Error as exc:
            raise HelixError(f"{self.path}: not a valid INI file: {exc}") from None

    def fail(self, section: str, key: str | None, what: str) -> None:
        raise HelixError(f"{self.path}: [{section}]{' ' + key if key else ''}: {what}")

    def section(self, section: str) -> configparser.SectionProxy:
        if not self.parser.has_section(section):
            self.fail(section, None, "missing section")
        return self.parser[section]

    def raw(self, section: str, key: str) -> str:
        values = self.section(section)
        if key not in values:
            self.fail(section, key, "missing field")
        return values[key]

    def number(self, section: str, key: str) -> float:
        text = self.raw(section, key)
        try:
            return parse_helix_value(text)
        except ValueError as exc:
            self.fail(section, key, str(exc))

    def integer(self, section: str, key: str, low: int, high: int) -> int:
        """A plain decimal integer in [low, high] (never evaluated as an expression)."""
        text = self.raw(section, key)  # its own error names the file once
        try:
            return bounded_int(text, low, high)
        except ValueError as exc:
            self.fail(section, key, str(exc))


def load_helix_cluster(cluster_path: str | Path, machine_profiles_path: str | Path | None = None) -> HelixCluster:
    """Read a Helix cluster file and its machine profiles (default: machine_profiles.ini beside it)."""
    ini = _Ini(cluster_path)
    profiles = _Ini(machine_profiles_path or Path(cluster_path).with_name("machine_profiles.ini"))
    num_nodes = ini.integer("NodeNames", "total_compute_nodes", 1, MAX_MACHINES)
    node_types = []
    for i in range(num_nodes):
        name = ini.raw(f"ComputeNode-{i}", "type").strip().strip("\"'")
        if not profiles.parser.has_section(name):
            ini.fail(f"ComputeNode-{i}", "type", f"machine type {name!r} is not in {profiles.path}")
        node_types.append(name)
    machine_types = tuple(_machine_type(profiles, name) for name in sorted(set(node_types)))
    links = []
    for section in ini.parser.sections():
        if section.startswith("Link-"):
            ends = section.split("-")[1:]
            known = {"source", "sink", *map(str, range(num_nodes))}
            if len(ends) != 2 or not set(ends) <= known:
                ini.fail(
                    section, None, f"a link section is named Link-<a>-<b> with a, b in 0..{num_nodes - 1}, source, sink"
                )
            links.append(
                HelixLink(
                    a=ends[0],
                    b=ends[1],
                    bw_bytes_per_s=_positive(ini, section, "bandwidth"),
                    latency_s=_nonneg(ini, section, "latency"),
                )
            )
    if num_nodes > 1 and not any(link.a.isdigit() and link.b.isdigit() for link in links):
        ini.fail("Link-<a>-<b>", None, f"{num_nodes} compute nodes but no link between two of them")
    nics = None
    if profiles.parser.has_section("SourceNode") and profiles.parser.has_section("SinkNode"):
        nics = (
            _positive(profiles, "SourceNode", "outbound_nic_speed"),
            _positive(profiles, "SinkNode", "inbound_nic_speed"),
        )
    return HelixCluster(
        source=ini.path,
        machine_types=machine_types,
        node_types=tuple(node_types),
        links=tuple(links),
        coordinator_nics=nics,
    )


def _positive(ini: _Ini, section: str, key: str) -> float:
    """A bandwidth (bytes/s) in a cluster spec's plausible range (docs/inputs.md)."""
    value = ini.number(section, key)
    if value <= 0:
        ini.fail(section, key, f"must be positive, got {ini.raw(section, key)!r}")
    if not MIN_RATE <= value <= MAX_BANDWIDTH:
        ini.fail(section, key, f"must be from 1 byte/s to 10 PB/s (a plausible link), got {ini.raw(section, key)!r}")
    return value


def _nonneg(ini: _Ini, section: str, key: str) -> float:
    """A latency (s) in a cluster spec's plausible range (docs/inputs.md)."""
    value = ini.number(section, key)
    if value < 0:
        ini.fail(section, key, f"must be >= 0, got {ini.raw(section, key)!r}")
    if value > MAX_FIXED_SECONDS:
        ini.fail(
            section, key, f"must be at most {MAX_FIXED_SECONDS:g} s (a plausible link), got {ini.raw(section, key)!r}"
        )
    return value


def _machine_type(profiles: _Ini, name: str) -> HelixMachineType:
    match = _MACHINE_TYPE.match(name)
    num_gpus = int(match.group("count") or 1)
    if num_gpus < 1:
        profiles.fail(name, None, "a machine type 'NAMExN' needs N >= 1")
    return HelixMachineType(
        name=name,
        gpu=match.group("gpu"),
        num_gpus=num_gpus,
        vram_bytes=_positive(profiles, name, "vram_size"),
        inbound_nic_bytes_per_s=_positive(profiles, name, "inbound_nic_speed"),
        outbound_nic_bytes_per_s=_positive(profiles, name, "outbound_nic_speed"),
    )


# ----------------------------------------------------------------------------
# Our names for Helix's machines


def load_datasheets(path: str | Path = DATASHEETS) -> dict[str, dict]:
    """GPU kind name -> its data-sheet entry (helix_type, peak_flops, mem_bw_bytes_per_s, intra_node_link)."""
    data = read_document(path, HelixError, finite=True)
    if not isinstance(data, dict):
        raise HelixError(f"{path}: expected a mapping of GPU kinds")
    return data


def kind_for(gpu: str, datasheets: dict[str, dict], source: str) -> str:
    for kind, sheet in datasheets.items():
        if str(sheet.get("helix_type")) == gpu:
            return kind
    known = ", ".join(str(s.get("helix_type")) for s in datasheets.values())
    raise HelixError(f"{source}: GPU type {gpu!r} has no data sheet in {DATASHEETS.name} (known: {known})")


def template_name(machine_type: str) -> str:
    """Our node template of a Helix machine type: `T4x2` -> `t4x2`."""
    return re.sub(r"[^a-z0-9]+", "-", machine_type.lower()).strip("-")


def region_name(region: int) -> str:
    """Our name of region `region` of find_regions: `r0`, `r1`, ..."""
    return f"r{region}"


def machine_templates(cluster: HelixCluster) -> list[tuple[str, str | None, tuple[int, ...]]]:
    """(node template, region or None, Helix indices of its machines) of the import: one template
    per machine type (`t4`), or on a cluster of several regions (find_regions) one per type and
    region (`t4-r1`), so that a template's servers sit in one region."""
    regions = find_regions(cluster)
    out = []
    for machine in cluster.machine_types:
        for r, members in enumerate(regions):
            indices = tuple(i for i in members if cluster.node_types[i] == machine.name)
            if indices and len(regions) == 1:
                out.append((template_name(machine.name), None, indices))
            elif indices:
                out.append((f"{template_name(machine.name)}-{region_name(r)}", region_name(r), indices))
    return out


def machine_nodes(cluster: HelixCluster) -> dict[int, str]:
    """Helix index -> our expanded node name (`t4-3`, or `a100` when the template has one machine)."""
    out = {}
    for template, _, indices in machine_templates(cluster):
        for copy, index in enumerate(indices):
            out[index] = template if len(indices) == 1 else f"{template}-{copy}"
    return out


def device_helix_names(cluster: HelixCluster, datasheets: dict[str, dict] | None = None) -> dict[str, str]:
    """Our device name -> Helix simulator node name, for every device of the imported spec.

    The devices of a multi-GPU machine all map to the machine: Helix places layers per machine."""
    datasheets = load_datasheets() if datasheets is None else datasheets
    out = {}
    for index, node in sorted(machine_nodes(cluster).items()):
        machine = cluster.machine_type(cluster.node_types[index])
        kind = kind_for(machine.gpu, datasheets, cluster.source)
        for j in range(machine.num_gpus):
            out[f"{node}/{kind}:{j}"] = helix_node_name(index)
    return out


def slowest_link(cluster: HelixCluster) -> tuple[float, float]:
    """(bytes/s, seconds) of the import's one inter-node link: the slowest compute pair, NICs included."""
    bw, latency = math.inf, 0.0
    for link in cluster.links:
        if not (link.a.isdigit() and link.b.isdigit()):
            continue
        ends = [cluster.machine_type(cluster.node_types[int(x)]) for x in (link.a, link.b)]
        # Helix's links carry both directions: each end sends through its outbound NIC
        nic = min(
            min(ends[0].outbound_nic_bytes_per_s, ends[1].inbound_nic_bytes_per_s),
            min(ends[1].outbound_nic_bytes_per_s, ends[0].inbound_nic_bytes_per_s),
        )
        bw, latency = min(bw, link.bw_bytes_per_s, nic), max(latency, link.latency_s)
    if not math.isfinite(bw):  # one machine: no inter-node link needed, but keep its NIC
        machine = cluster.machine_types[0]
        bw = min(machine.inbound_nic_bytes_per_s, machine.outbound_nic_bytes_per_s)
    return bw, latency


# ----------------------------------------------------------------------------
# Regions: machines joined by fast links


def pair_bw(cluster: HelixCluster, a: int, b: int, bw: float) -> float:
    """A pair's bandwidth with the NICs of its ends (each end sends through its outbound NIC)."""
    ends = [cluster.machine_type(cluster.node_types[x]) for x in (a, b)]
    nics = [e.outbound_nic_bytes_per_s for e in ends] + [e.inbound_nic_bytes_per_s for e in ends]
    return min(bw, *nics)


def find_regions(cluster: HelixCluster) -> tuple[tuple[int, ...], ...]:
    """ComputeNode indices of each region (the rule: llm_planner.helix.regions); one region without a
    bandwidth gap."""
    n = len(cluster.node_types)
    pairs = [(int(k.a), int(k.b), k.bw_bytes_per_s) for k in cluster.links if k.a.isdigit() and k.b.isdigit()]
    speeds = sorted({bw for _, _, bw in pairs})
    gaps = [(speeds[i + 1] / speeds[i], speeds[i + 1]) for i in range(len(speeds) - 1)]
    ratio, fast = max(gaps, default=(1.0, math.inf))
    if ratio < REGION_GAP:
        return (tuple(range(n)),)
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, bw in pairs:
        if bw >= fast:
            parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return tuple(tuple(g) for g in sorted(groups.values()))


# ----------------------------------------------------------------------------
# Per-layer profiles


def read_profile_csv(path: str | Path) -> list[tuple[int, float]]:
    """Rows `size,milliseconds` of a Helix profile -> [(size, seconds)], sizes strictly increasing."""
    rows: list[tuple[int, float]] = []
    for number, line in enumerate(read_text(path, HelixError).splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        try:
            if len(cells) != 2:
                raise ValueError(f"expected 'size,milliseconds', got {quote(line)}")
            size, ms = bounded_int(cells[0], 0, MAX_BATCH), float(cells[1])
            if not (math.isfinite(ms) and 0 <= ms <= MOST_LAYER_MS):
                raise ValueError(f"time must be from 0 to {MOST_LAYER_MS:,.0f} ms (a layer's), got {quote(line)}")
            if 0 < ms < LEAST_LAYER_MS:  # under a nanosecond: a typo, and a cluster spec's time cannot hold it
                raise ValueError(f"time must be 0 or at least {LEAST_LAYER_MS:g} ms (a layer's), got {quote(line)}")
        except ValueError as exc:
            raise HelixError(f"{path}: line {number}: {exc}") from None
        if rows and size <= rows[-1][0]:
            raise HelixError(f"{path}: line {number}: sizes must increase, got {size} after {rows[-1][0]}")
        rows.append((size, ms * 1e-3))
    if len(rows) < 2:
        raise HelixError(f"{path}: needs at least two rows 'size,milliseconds', got {len(rows)}")
    return rows


def default_model(profiles_dir: str | Path) -> str:
    """The model a Helix model manager folder is for: its name, _ -> - ("llama2_70b" -> "llama2-70b")."""
    return Path(profiles_dir).name.replace("_", "-")


def serving_profile_yaml(
    cluster: HelixCluster,
    profiles_dir: str | Path,
    *,
    model: str | None = None,
    datasheets: dict[str, dict] | None = None,
) -> str:
    """Our serving profile (llm_planner.cost.serving_profile) from Helix's per-machine-type layer times."""
    datasheets = load_datasheets() if datasheets is None else datasheets
    root = Path(profiles_dir)
    model = model or default_model(root)
    lines = [
        "# measured time of one decoder layer per device kind (llm_planner serving profile)",
        f"# imported from Helix's per-machine-type profiles in {root.name}/ (milliseconds -> seconds)",
        "format: serving-profile/1",
        f"model: {json.dumps(model)}",
        "dtype: fp16",
        f"source: Helix (ASPLOS'25) layer profiles {root.name}/<type>/decode_bs2time.csv and prompt_bs2time.csv",
        "kinds:",
    ]
    for machine in cluster.machine_types:
        folder = root / machine.name.lower()
        if machine.num_gpus > 1:
            lines.insert(
                2, f"# {machine.name}: left out (its profile times a {machine.num_gpus}-GPU tensor-parallel machine)"
            )
            continue
        decode = read_profile_csv(folder / "decode_bs2time.csv")
        prefill = read_profile_csv(folder / "prompt_bs2time.csv")
        lines += [
            f"  {kind_for(machine.gpu, datasheets, cluster.source)}:  # Helix {machine.name}",
            f"    decode_layer_s: {_pairs(decode)}",
            f"    prefill_layer_s: {_pairs(prefill)}",
        ]
    return "\n".join(lines) + "\n"


def _pairs(rows: list[tuple[int, float]]) -> str:
    return "[" + ", ".join(f"[{size}, {seconds:.6g}]" for size, seconds in rows) + "]"
