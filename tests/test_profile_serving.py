"""`llm-planner profile-serving`: a layer's parts timed on this machine, written as a serving
profile that `--profile` reads back."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import yaml

from llm_planner.cli.main import main
from llm_planner.cost.iteration import Load
from llm_planner.cost.serving_profile import parse_serving_profile
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.runtime import serve_parts

FAST = ["--tokens", "1,4", "--batches", "1,2", "--contexts", "8,16", "--repeats", "1", "--warmup", "0"]


def _run(tmp_path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "p.yaml"
    code = main(["profile-serving", "--kind", "cpu-core", "-o", str(out), *FAST, *args])
    return code, (yaml.safe_load(out.read_text()) if code == 0 else {})


def test_the_profile_loads_and_holds_a_table_per_degree(tmp_path):
    raw = tmp_path / "raw.json"
    code, doc = _run(tmp_path, "--model", "gpt2", "--tp", "1,2", "--attention", "--raw", str(raw))
    assert code == 0
    profile = parse_serving_profile(doc, source="p.yaml")
    for k in (1, 2):
        tables = profile.tables("cpu-core", k)
        assert tables.linear is not None and not tables.linear_includes_elementwise
        assert tables.attn_decode is not None
        assert tables.kernel_times(768 * 4)["linear"](Load(decodes=4)) > 0
    timings = json.loads(raw.read_text())["tp"]["1"]
    assert len(timings["layer_s"]) == 2 and len(timings["attn_decode_s"]) == 4


def test_attention_is_left_to_the_kernel_model_unless_asked(tmp_path):
    code, doc = _run(tmp_path, "--model", "llama3-8b", "--tp", "8")
    assert code == 0
    entry = doc["kinds"]["cpu-core"]["tp"][8]
    assert "attn_decode_s" not in entry and len(entry["linear_layer_s"]) == 2
    assert "kernel model" in doc["source"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama3-8b", "--tp", "3"], "32 attention heads do not split over a tensor-parallel group of 3"),
        (["--model", "mixtral-8x7b"], "dense decoders"),
        (["--model", "gpt2", "--tokens", "4,1"], None),
        (["--model", "gpt2", "--device", "tpu"], "--device"),
        (["--model", "gpt2", "--kind", "a b"], "--kind"),
        (["--model", "gpt2", "--dtype", "fp8"], "needs a GPU with fp8 matrix units"),
        (["--model", "nosuch"], "--model 'nosuch': not a decoder preset"),
        (["--model", "gpt2", "--dtype", "fp8", "--attention"], "leave out --attention"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(tmp_path, capsys, args, message):
    code = main(["profile-serving", "--kind", "cpu-core", "-o", str(tmp_path / "p.yaml"), *FAST, *args])
    assert code == 2
    if message is not None:
        assert message in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


def test_packed_decode_attention_equals_grouped_query_attention():
    """Packing a key/value head's query heads as its queries computes what grouped-query attention does."""
    torch.manual_seed(0)
    shape = serve_parts.member_shape(preset_config("llama3-8b"), 8)  # 4 query heads over 1 key/value head
    q = torch.randn(3, shape.heads, 1, 16)
    k, v = torch.randn(3, shape.kv_heads, 20, 16), torch.randn(3, shape.kv_heads, 20, 16)
    packed = serve_parts._attention(q, k, v, serve_parts.SDPBackend.MATH)()
    reference = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.allclose(packed.reshape(reference.shape), reference, atol=1e-6)


def test_the_member_shape_is_the_layout_share():
    shape = serve_parts.member_shape(preset_config("llama3-70b"), 4)
    assert (shape.heads, shape.kv_heads, shape.inner, shape.head_dim) == (16, 2, 7168, 128)
    assert shape.gated and shape.rotary and not shape.bias


def test_fp8_projections_time_every_token_count():
    """The fp8 projections' shapes are what torch._scaled_mm takes (it runs on the CPU too, slowly)."""
    shape = serve_parts.member_shape(preset_config("gpt2"), 4)
    table = serve_parts.fp8_linear_table(shape, (1, 16), serve_parts.Timer(torch.device("cpu"), 1, 0))
    assert [t for t, _ in table] == [1, 16] and all(s > 0 for _, s in table)


def test_a_time_that_falls_with_more_tokens_is_raised_and_said(caplog):
    """Timing noise can put a larger token count below a smaller one; the profile loader refuses a
    falling table (extended past its end it would make a layer free), so the command raises each such
    time to the one before it and says how many it raised."""
    from llm_planner.cli.profile_serving import _profile_yaml

    raw = {1: {"linear_layer_s": [(1, 0.00195), (8, 0.0640), (64, 0.0162)]}}
    text = _profile_yaml("gpt2", "k", "fp32", raw, "constructed", attention=False)
    table = yaml.safe_load(text)["kinds"]["k"]["tp"][1]["linear_layer_s"]
    assert table == [[1, 0.00195], [8, 0.064], [64, 0.064]]
    assert "1 of 3 linear-layer times fall below the one before them" in caplog.text


def test_the_timer_reports_each_points_flops_for_the_progress_bar():
    """Every point timed advances the bar by its FLOPs: the four projections' 2 T sum(in x out)
    twice per token count (the layer and its projections), decode attention's 4 B L heads x head_dim."""
    shape = serve_parts.member_shape(preset_config("gpt2"), 1)
    ticks = []
    timer = serve_parts.Timer(torch.device("cpu"), 1, 0, tick=ticks.append)
    serve_parts.linear_tables(shape, (1, 4), timer, torch.float32)
    per_token = 2 * (768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768)
    assert ticks == [per_token, per_token, 4 * per_token, 4 * per_token]
    ticks.clear()
    serve_parts.attn_grid(shape, (2,), (8,), timer, torch.float32)
    assert ticks == [4 * 2 * 8 * 12 * 64]
