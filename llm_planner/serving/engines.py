"""What an engine's export accepts: the one rule that `plan --exportable vllm|sglang` searches
within (llm_planner.serving.search), `verify` checks (llm_planner.serving.verify_claims) and
`export --to vllm|sglang|megatron` refuses by (llm_planner.export.serving), with the option that
avoids each refusal.

One copy of a replica pattern is one engine: p pipeline stages, each a tensor-parallel group of
one kind on one host, with m micro-batches in flight. vLLM and SGLang run it when

- every stage has the same degree t (they take one --tensor-parallel-size / --tp-size),
- no stage is on a CPU (their pipelines run GPU workers),
- m = p (vLLM keeps one batch per stage in flight; SGLang's pipeline loop keeps pp-size
  micro-batches, pp-async-batch-depth 0 being its default),
- across hosts, every host holds the same number of consecutive stages (SGLang's launcher, and
  vLLM's own multi-node mode, give node k of n the ranks, hence the stages, k p/n .. (k+1) p/n - 1),
- a group with data-parallel attention (llm_planner.cost.dp_attention) is the whole engine, one
  stage: vLLM runs it as `--data-parallel-size k --enable-expert-parallel` and SGLang as
  `--tp-size k --dp-size k --enable-dp-attention --ep-size k`, neither under a pipeline here (a
  group over whole servers runs with their multi-node flags, vLLM not over Ray); and
  SGLang only for the model types its help names (DP_ATTENTION_MODEL_TYPES). Megatron-LM runs no
  data-parallel attention.

The two engines accept the same layouts today; each keeps its name so that its rule can change
alone. vLLM over Ray (`export --vllm-multinode ray`) replaces the last rule with its own host
order (llm_planner.export.vllm_ray). Megatron-LM's parallel sizes need the first two only.

The search sees a layout before its devices are assigned: `layout_forms` names each stage's host
by a stand-in that holds for every placement llm_planner.serving.assign may give (a class of one
server: that server; a block inside a server: one host; whole servers: per_server / t stages
each), and gives none when that depends on the placement (two segments on servers of one
template with more than one server may share a server or not): such a layout is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llm_planner.serving.classes import ServerClass, is_dp
from llm_planner.serving.layout import Layout

ENGINES = ("vllm", "sglang")  # what --exportable takes
TITLES = {"vllm": "vLLM", "sglang": "SGLang", "megatron": "Megatron-LM"}
ONE_BATCH_PER_STAGE = ("vllm", "sglang")
EVEN_HOSTS = ("vllm", "sglang")
# The model types an engine runs with data-parallel attention (None: any mixture of experts). SGLang's
# --enable-dp-attention help: "Currently DeepSeek-V2 and Qwen 2/3 MoE models are supported."
DP_ATTENTION_MODEL_TYPES = {"vllm": None, "sglang": ("deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe")}


def dp_attention_refusal(engine: str | None, model_type: str) -> str | None:
    """Why `engine` runs no data-parallel attention for the model type (None: it does, or no engine)."""
    if engine is None:
        return None
    if engine not in DP_ATTENTION_MODEL_TYPES:
        return f"{TITLES[engine]} runs no data-parallel attention"
    types = DP_ATTENTION_MODEL_TYPES[engine]
    if types is not None and model_type not in types:
        return f"{TITLES[engine]} runs data-parallel attention for model types {', '.join(types)}, not {model_type!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class StageForm:
    """What the rule sees of one pipeline stage."""

    degree: int
    kind: str
    cpu: bool
    host: str  # the stage's host, or the search's stand-in for it (module docstring)
    attention: str = "tp"  # or one of classes.DP_ATTENTIONS: data-parallel attention over the group


def remedy(engine: str) -> str:
    """The planning option that avoids every refusal of `engine`'s rule."""
    if engine in ENGINES:
        return f"plan with --exportable {engine}"
    return "plan with --exportable vllm or --exportable sglang (Megatron-LM takes their layouts too)"


def engine_micro_batches(engine: str | None, stages: int) -> int | None:
    """The micro-batches `engine` runs a pipeline of `stages` with; None when it takes any."""
    return stages if engine in ONE_BATCH_PER_STAGE else None


def engine_refusal(
    engine: str, stages: Sequence[StageForm], micro_batches: int | None, *, even_hosts: bool = True
) -> str | None:
    """Why `engine` cannot run these stages with `micro_batches` in flight (None: it can, or the
    count is not known yet), as "stage S ...: reason (remedy)"; None when it runs them.
    `even_hosts` False: the host rule is another's (vLLM over Ray)."""
    title, fix = TITLES[engine], remedy(engine)
    for s, st in enumerate(stages):
        if st.cpu:
            return (
                f"stage {s} runs on CPU device kind {st.kind!r}: {title} runs GPU stages only "
                f"(plan without --allow-cpu, or {fix})"
            )
    for s, st in enumerate(stages):
        if is_dp(st.attention) and engine == "megatron":
            return (
                f"stage {s} runs data-parallel attention: {title} runs tensor-parallel groups only "
                "(plan with --no-dp-attention)"
            )
        if is_dp(st.attention) and len(stages) > 1:
            return (
                f"stage {s} runs data-parallel attention in a pipeline of {len(stages)} stages: {title} runs it only "
                f"as a whole engine of one stage ({fix})"
            )
    for s, st in enumerate(stages):
        if st.degree != stages[0].degree:
            return (
                f"stage {s} has tensor-parallel degree {st.degree}, stage 0 has {stages[0].degree}: {title} uses "
                f"one tensor-parallel size for every stage ({fix})"
            )
    want = engine_micro_batches(engine, len(stages))
    if want is not None and micro_batches is not None and micro_batches != want:
        return (
            f"{micro_batches} micro-batch(es) over {len(stages)} pipeline stage(s): {title} keeps one batch per "
            f"stage in flight (micro-batches = pipeline size; {fix})"
        )
    if even_hosts and engine in EVEN_HOSTS:
        return _uneven_hosts(engine, stages)
    return None


def without_remedy(refusal: str) -> str:
    """engine_refusal's "...: reason (remedy)" without its closing remedy, for a message that names its own."""
    return refusal.rsplit(" (", 1)[0] if refusal.endswith(")") and " (" in refusal else refusal


def _uneven_hosts(engine: str, stages: Sequence[StageForm]) -> str | None:
    hosts = list(dict.fromkeys(st.host for st in stages))
    per_host = len(stages) / len(hosts)
    for k, host in enumerate(hosts):
        mine = [i for i, st in enumerate(stages) if st.host == host]
        first = round(k * per_host)
        if mine != list(range(first, first + len(mine))) or len(mine) != per_host:
            extra = "; or export with --vllm-multinode ray" if engine == "vllm" else ""
            return (
                f"stage {mine[0]} on host {host!r} holds stages {mine} of {len(stages)}: {TITLES[engine]} across "
                f"{len(hosts)} hosts gives each the same number of consecutive stages ({remedy(engine)}{extra})"
            )
    return None


def layout_forms(layout: Layout, classes: dict[str, ServerClass]) -> list[StageForm] | None:
    """The stages of any copy of the layout as the rule sees them (module docstring); None when
    which of them share a host depends on the placement."""
    templates = [classes[seg.class_name].template for seg in layout]
    out = []
    for seg in layout:
        sc = classes[seg.class_name]
        cpu = sc.kind.type == "cpu"
        if sc.num_servers == 1:
            form = StageForm(degree=seg.degree, kind=sc.kind.name, cpu=cpu, host=sc.template, attention=seg.attention)
            out += [form] * seg.stages
            continue
        if templates.count(sc.template) > 1:
            return None
        per_server = max(1, sc.per_server // seg.degree) if seg.devices > sc.per_server else seg.stages
        out += [
            StageForm(
                degree=seg.degree,
                kind=sc.kind.name,
                cpu=cpu,
                host=f"{sc.template}#{i // per_server}",
                attention=seg.attention,
            )
            for i in range(seg.stages)
        ]
    return out


def layout_refusal(
    engine: str | None, layout: Layout, classes: dict[str, ServerClass], micro_batches: int | None = None
) -> str | None:
    """Why `engine`'s export would refuse some copy of the layout (None: it takes every copy, or
    no engine is asked for); `micro_batches` None: the search picks them by engine_micro_batches."""
    if engine is None:
        return None
    forms = layout_forms(layout, classes)
    if forms is None:
        return (
            f"two segments on servers of one template may share a server or not, as the devices fall: "
            f"{TITLES[engine]}'s hosts rule cannot be checked before the devices are assigned"
        )
    return engine_refusal(engine, forms, micro_batches)
