"""Sliding-window models planned as what they are (llm_planner.graph.attention_window): a window
that holds the longest context is planned as full attention and said so once; a shorter one is
refused naming the file, the key, the window and the context; a mix of sliding and full layers
is refused when the config is read. Dense and mixture-of-experts configs follow the same rule."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import yaml
from serving_fixtures import workload, write_fleet
from test_moe_config import MIXTRAL_JSON, QWEN3_JSON

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.cost import measured
from llm_planner.graph import decoder_presets, hf_config
from llm_planner.graph import transformer as tr
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.ir import GraphError
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.serving.context import ServingContext, ServingOptions

SPEC = str(Path(__file__).resolve().parents[1] / "cluster_specs" / "rtx4090-workstation.yaml")
# Mistral-7B-v0.1's hyper-parameters: every layer slides a window of 4096 tokens.
MISTRAL_JSON = {
    "architectures": ["MistralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
# A small Qwen2 (24 layers) with its window off (use_sliding_window false, the class default).
QWEN2_JSON = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 21,
}
WINDOW_LOG = "llm_planner.graph.attention_window"


def _model(tmp_path: Path, data: dict, name: str = "mistral-7b") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def _plan_args(model: Path, prompt: int, output: int, out: Path) -> list[str]:
    return ["plan", "--cluster", SPEC, "--model", str(model), "--objective", "serving", "--prompt-len", str(prompt)] + [
        "--output-len",
        str(output),
        "--tpot-slo",
        "50 ms",
        "-o",
        str(out),
    ]


def _read(tmp_path: Path, data: dict) -> tr.DecoderConfig:
    return hf_config.load_config_file(_model(tmp_path, data, "m") / "config.json")


def _context(config: tr.DecoderConfig, tmp_path: Path, prompt: int, output: int) -> ServingContext:
    cluster = load_cluster(write_fleet(tmp_path))
    return ServingContext(cluster, config, workload(prompt, output), "fp16", ServingOptions())


def test_a_mistral_window_that_holds_the_context_plans_as_full_attention(tmp_path, caplog):
    model = _model(tmp_path, MISTRAL_JSON, "said-once")  # a name no other test logs (once per process)
    assert _read(tmp_path, MISTRAL_JSON).sliding_window == 4096
    out = tmp_path / "plan.yaml"
    with caplog.at_level(logging.INFO, logger=WINDOW_LOG):
        assert main(_plan_args(model, 768, 256, out)) == 0
    said = [r.getMessage() for r in caplog.records if r.name == WINDOW_LOG]
    assert len(said) == 1 and "window of 4096 tokens" in said[0] and "full attention" in said[0]
    assert yaml.safe_load(out.read_text())["serving"]["tokens_per_s"] > 0


def test_a_mistral_window_shorter_than_the_context_is_refused(tmp_path, capsys):
    model = _model(tmp_path, MISTRAL_JSON)
    out = tmp_path / "plan.yaml"
    assert main(_plan_args(model, 8000, 192, out)) == 2
    err = capsys.readouterr().err
    for part in (
        str(model / "config.json"),
        "sliding_window 4096 < prompt 8000 + output 192 tokens (--prompt-len + --output-len)",
        "sliding-window attention (KV cache capped at the window) is not modelled",
    ):
        assert part in err, err
    assert "Traceback" not in err and not out.exists()


def test_a_workload_file_is_named_and_its_longest_request_counts(tmp_path, capsys):
    model = _model(tmp_path, MISTRAL_JSON)
    shapes = tmp_path / "load.yaml"
    shapes.write_text(
        yaml.safe_dump({"requests": [{"prompt_len": 512, "output_len": 64}, {"prompt_len": 4000, "output_len": 512}]})
    )
    argv = ["plan", "--cluster", SPEC, "--model", str(model), "--objective", "serving", "--workload", str(shapes)]
    assert main([*argv, "--tpot-slo", "50 ms", "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"sliding_window 4096 < prompt 4000 + output 512 tokens ({shapes}: requests)" in err, err


def test_a_placement_plan_is_held_to_its_seq_len(tmp_path):
    model = _model(tmp_path, MISTRAL_JSON)
    graph = build_model_graph(ModelSpec(name=str(model), phase="prefill", seq_len=4096, granularity="block"))
    assert len(graph.tasks) == 35
    with pytest.raises(GraphError) as info:
        build_model_graph(ModelSpec(name=str(model), phase="decode", seq_len=8192, granularity="block"))
    assert str(info.value).startswith(f"{model / 'config.json'}: sliding_window 4096 < seq_len 8192 tokens")
    config = dataclasses.replace(decoder_presets.preset_config("llama2-7b"), hf_model_type="mistral", sliding_window=16)
    with pytest.raises(GraphError, match="model 'llama2-7b': sliding_window 16 < seq_len 17 tokens"):
        build_decoder_graph(config, phase="prefill", seq_len=17, granularity="block", dtype="fp16")


def test_a_window_changes_no_measured_time_key(tmp_path):
    """Planned only where it holds the context, a window is full attention: its profile key is the same."""
    full = dataclasses.replace(decoder_presets.preset_config("llama2-7b"), hf_model_type="mistral")
    windowed = dataclasses.replace(full, sliding_window=4096)
    keys = [
        measured.task_key(g, g.task("block.0"))
        for g in (
            build_decoder_graph(c, phase="decode", seq_len=1024, granularity="block", dtype="fp16")
            for c in (full, windowed)
        )
    ]
    assert keys[0] == keys[1]


@pytest.mark.parametrize(
    ("change", "window"),
    [({}, 4096), ({"sliding_window": None}, None), ({"sliding_window": 8192}, 8192)],
)
def test_mistral_reads_its_window_as_transformers_does(tmp_path, change, window):
    data = {**MISTRAL_JSON, **change}
    if not change:
        del data["sliding_window"]  # MistralConfig's default: 4096
    assert _read(tmp_path, data).sliding_window == window


def test_a_qwen2_config_without_its_window_plans_any_context(tmp_path):
    config = _read(tmp_path, QWEN2_JSON)
    assert config.sliding_window is None
    ctx = _context(config, tmp_path, 8000, 192)  # longer than the 4096 a window would have been
    assert ctx.workload.max_context == 8192


@pytest.mark.parametrize(
    ("change", "window"),
    [
        ({"max_window_layers": 0}, 32768),  # every layer i >= 0 slides
        ({"max_window_layers": 24}, None),  # none: the first 24 of 24 attend fully
        ({"max_window_layers": 0, "sliding_window": None}, None),
        ({"layer_types": ["sliding_attention"] * 24}, 32768),
        ({"layer_types": ["full_attention"] * 24}, None),
    ],
)
@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])  # Qwen3Config reads the window as Qwen2Config does
def test_qwen2_slides_every_layer_or_none(tmp_path, change, window, model_type):
    data = {**QWEN2_JSON, "model_type": model_type, "use_sliding_window": True, **change}
    assert _read(tmp_path, data).sliding_window == window


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({**QWEN2_JSON, "use_sliding_window": True}, "key 'max_window_layers'.*layers 21-23 of 24 slide"),
        (
            {**QWEN2_JSON, "model_type": "qwen3", "use_sliding_window": True},
            "key 'max_window_layers'.*layers 21-23 of 24 slide",
        ),
        (
            {**QWEN2_JSON, "use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"] * 12},
            "key 'layer_types'.*layers 1, 3, 5,",
        ),
        ({**QWEN2_JSON, "use_sliding_window": True, "layer_types": ["sliding_attention"]}, "must list 24 entries"),
        ({**QWEN2_JSON, "use_sliding_window": True, "max_window_layers": 0, "sliding_window": 0}, "positive integer"),
        # qwen2_moe without layer_types slides the even layers below max_window_layers
        (
            {**QWEN3_JSON, "model_type": "qwen2_moe", "use_sliding_window": True, "sliding_window": 4096},
            "key 'max_window_layers'.*layers 0, 2, 4,",
        ),
        ({**QWEN3_JSON, "model_type": "gpt_oss"}, "alternating sliding windows"),
    ],
)
def test_a_mix_of_sliding_and_full_layers_is_refused(tmp_path, data, match):
    with pytest.raises(GraphError, match=match) as info:
        _read(tmp_path, data)
    assert str(tmp_path / "m" / "config.json") in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        {**MIXTRAL_JSON, "sliding_window": 4096},
        {**QWEN3_JSON, "use_sliding_window": True, "sliding_window": 4096},  # every layer: the class has no mix
    ],
    ids=["mixtral", "qwen3_moe"],
)
def test_moe_and_dense_follow_one_rule(tmp_path, data):
    config = _read(tmp_path, data)
    assert config.sliding_window == 4096
    assert _context(config, tmp_path, 3000, 1000).workload.max_context == 4000
    with pytest.raises(GraphError, match="model 'm': sliding_window 4096 < prompt 4000 \\+ output 512 tokens"):
        _context(config, tmp_path, 4000, 512)


def test_the_window_reaches_the_transformers_config(tmp_path):
    """The config to_hf_config builds slides the window on every layer, as the one it was read from."""
    mistral = hf_config.to_hf_config(_read(tmp_path / "a", MISTRAL_JSON))
    assert mistral.model_type == "mistral" and mistral.sliding_window == 4096  # MistralModel: every layer
    qwen2 = hf_config.to_hf_config(
        _read(tmp_path / "b", {**QWEN2_JSON, "use_sliding_window": True, "max_window_layers": 0})
    )
    assert qwen2.sliding_window == 32768 and qwen2.layer_types == ["sliding_attention"] * 24


def test_the_qwen3_preset_routes_as_its_checkpoint():
    """Qwen3-30B-A3B's config.json has norm_topk_prob true: the preset and its transformers config too."""
    preset = decoder_presets.preset_config("qwen3-30b-a3b")
    assert preset.norm_topk_prob is True
    hf = hf_config.to_hf_config(preset)
    assert hf.norm_topk_prob is True
    assert hf_config.to_hf_config(decoder_presets.preset_config("qwen1.5-moe-a2.7b")).norm_topk_prob is False
    pytest.importorskip("torch")
    from llm_planner.runtime import moe_layers

    assert moe_layers.renormalises(hf)
    assert not moe_layers.renormalises(hf_config.to_hf_config(decoder_presets.preset_config("qwen1.5-moe-a2.7b")))


def test_a_dense_config_has_no_router_to_normalise():
    with pytest.raises(GraphError, match="no experts .nor norm_topk_prob."):
        dataclasses.replace(decoder_presets.preset_config("llama2-7b"), norm_topk_prob=True)
    with pytest.raises(GraphError, match="llama models have no sliding window"):
        dataclasses.replace(decoder_presets.preset_config("llama2-7b"), sliding_window=4096)


def test_phi3_slides_every_layer_when_its_config_says_so(tmp_path):
    """Phi3Config: sliding_window on every layer (Phi-3-mini-4k-instruct: 2047); missing or null: none
    (not mistral's class default of 4096)."""
    phi3 = {**MISTRAL_JSON, "model_type": "phi3", "sliding_window": 2047}
    assert _read(tmp_path / "a", phi3).sliding_window == 2047
    assert _read(tmp_path / "b", {k: v for k, v in phi3.items() if k != "sliding_window"}).sliding_window is None
    config = _read(tmp_path / "c", phi3)
    with pytest.raises(GraphError, match="sliding_window 2047 < "):
        _context(config, tmp_path / "c", 2000, 100)
