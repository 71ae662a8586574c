"""`verify`, `show` and `export` of serving plan files that were edited or forged.

A real serving plan (the small fleet of tests/serving_fixtures.py, written once per module) is
mutated field by field: wrong types, nulls, NaN and infinite numbers, huge and negative numbers,
integer keys, unknown keys, removed or renamed fields, and forged figures (x1.5). In-process, each
command either succeeds or exits 2 with one message naming the plan file (and a field) and no
traceback; `verify` exits 0 only for a plan whose change it cannot see by design (a search
statistic, an option the layout still meets, a target the plan still meets: ACCEPTED), and
otherwise 1 (violations, naming fields) or 2. Examples are derandomized.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.cli.main import main

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import CONFIG_LLAMA, emit, field_mutation, paths  # noqa: E402
from plan_files import written_plan  # noqa: E402
from serving_fixtures import write_fleet  # noqa: E402

FUZZ = settings(
    max_examples=int(os.environ.get("SERVING_FUZZ_EXAMPLES", "50")),  # more to hunt, with derandomize off
    derandomize=os.environ.get("SERVING_FUZZ_EXAMPLES") is None,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
SECRET = "hunter2-do-not-print"
# Fields a changed value of which may still verify: how one run of the search went, and targets or
# options the plan still meets (a plan valid for them)
ACCEPTED = (
    "solve_time_s",
    "timings_s",
    "layouts_evaluated",
    "layouts_candidate",
    "layouts_left",
    "options",
    "ttft_slo_s",
    "weight",
)


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, dict]:
    """A folder with the fleet and a vLLM-exportable serving plan of it, and the plan's data."""
    folder = tmp_path_factory.mktemp("serving")
    spec = write_fleet(folder)
    plan = folder / "plan.yaml"
    argv = ["plan", "--cluster", str(spec), "--model", "llama2-7b", "--objective", "serving", "--tpot-slo", "50 ms"]
    assert main([*argv, "--prompt-len", "256", "--output-len", "128", "--exportable", "vllm", "-o", str(plan)]) == 0
    return folder, yaml.safe_load(plan.read_text())


def _write(folder: Path, text: str, name: str = "forged.yaml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _check_all(path: Path, what: str, accepted: bool) -> None:
    """verify, show and export of one plan file: the outcomes of the module docstring."""
    code, out = _run(["verify", str(path)])
    flat = " ".join(out.split())
    assert "Traceback" not in out, what
    if code == 0:
        assert accepted, f"{what}: verify passed a changed plan: {flat}"
    else:
        assert code in (1, 2), f"{what}: verify exit {code}: {flat}"
        assert str(path) in flat, f"{what}: the message does not name {path}: {flat}"
        assert code == 1 or flat.count("error:") == 1, f"{what}: {flat}"
    for argv in (["show", str(path)], ["export", str(path), "--to", "vllm"]):
        code, out = _run(argv)
        flat = " ".join(out.split())
        assert "Traceback" not in out and code in (0, 2), f"{what}: {argv[0]} exit {code}: {flat}"
        if code == 2:
            assert str(path) in flat and flat.count("error:") == 1, f"{what}: {argv[0]}: {flat}"


@st.composite
def forged(draw, base: dict) -> tuple[str, str, str]:
    """A number times 1.5, or a mapping's key written as an integer."""
    doc = copy.deepcopy(base)
    numeric = [p for p in paths(doc) if _is_number(_at(doc, p))]
    path = draw(st.sampled_from(numeric))
    if draw(st.booleans()):
        parent = _at(doc, path[:-1])
        parent[path[-1]] = parent[path[-1]] * 1.5
        return "forge", f"x1.5 {'.'.join(map(str, path))}", emit(doc)
    key = next(p for p in reversed(path) if isinstance(p, str))
    text = emit(doc).replace(f'"{key}":', "7:", 1)
    return "int-key", f"integer key for {key}", text


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@pytest.mark.heavy
def test_the_unmutated_plan_verifies_shows_and_exports(base):
    folder, data = base
    path = _write(folder, emit(data))
    assert _run(["verify", str(path)])[0] == 0
    assert _run(["show", str(path)])[0] == 0
    assert _run(["export", str(path), "--to", "vllm"])[0] == 0


@pytest.mark.slow  # every mutation is verified in full: minutes on 2 cores
@FUZZ
@given(data=st.data())
def test_mutated_serving_plans(base, data):
    folder, plan = base
    kind, what, text = data.draw(st.one_of(field_mutation(plan, yaml=True), forged(plan)))
    changed = what.split(" ", 1)[-1]
    accepted = kind in ("forge", "replace") and any(name in changed.split(".") for name in ACCEPTED)
    _check_all(_write(folder, text), what, accepted)


def _edited(folder: Path, data: dict, edit) -> Path:
    data = copy.deepcopy(data)
    edit(data)
    return _write(folder, yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("field", ["cluster", "profile"])
def test_a_forged_input_file_is_refused_before_it_is_parsed(base, field):
    """A plan naming another file (a matching-looking path, different bytes) gets no line of it quoted."""
    folder, data = base
    (folder / "other").mkdir(exist_ok=True)
    secret = _write(folder / "other", f"name: {SECRET}\npassword: [{SECRET}\n", "fleet.yaml")

    def forge(d):
        d["inputs"][field] = str(secret)
        d["inputs"][f"{field}_sha256"] = d["inputs"]["cluster_sha256"]

    path = _edited(folder, data, forge)
    for argv in (["verify", str(path)], ["export", str(path), "--to", "vllm"]):
        if field == "profile" and argv[0] == "export":
            continue  # export reads no profile
        code, out = _run(argv)
        assert code == 2 and SECRET not in out and "Traceback" not in out, out
        assert f"inputs.{field}_sha256" in out and "not the file the plan was made from" in " ".join(out.split())


def test_a_plan_without_a_required_hash_is_refused(base):
    folder, data = base

    def drop(d):
        d["inputs"]["profile"], d["inputs"]["profile_sha256"] = "fleet.yaml", None

    code, out = _run(["verify", str(_edited(folder, data, drop))])
    assert code == 2 and "inputs.profile_sha256" in out


def test_a_forged_placement_input_is_refused_before_it_is_parsed(tmp_path):
    plan = written_plan(tmp_path)
    data = yaml.safe_load(plan.read_text())
    secret = _write(tmp_path, f"name: {SECRET}\nnodes: [{SECRET}\n", "other.yaml")
    data["inputs"]["cluster"] = str(secret)
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out = _run(["verify", str(plan)])
    assert code == 2 and SECRET not in out and "sha256 differs" in out, out


def _forged_claim(base, edit) -> str:
    folder, data = base
    code, out = _run(["verify", str(_edited(folder, data, edit))])
    assert code in (1, 2), out
    return " ".join(out.split())


def test_verify_refuses_forged_baselines(base):
    def forge(d):
        d["baselines"]["megatron"]["tokens_per_s"] *= 1.5

    assert "baselines.megatron.tokens_per_s" in _forged_claim(base, forge)


def test_the_unrestricted_plan_is_recorded_and_bounds_the_exportable_one(base):
    """--exportable vllm also searches without it: its best plan serves at least as much, and the
    plan's bound is the smaller of its own and that plan's (each holds over every plan)."""
    _, data = base
    sv, free = data["serving"], data["serving"]["unrestricted"]
    assert free is not None and free["replicas"]
    assert free["tokens_per_s"] >= sv["tokens_per_s"] * (1 - 1e-9)
    assert sv["upper_bound_tokens_per_s"] <= free["upper_bound_tokens_per_s"] * (1 + 1e-9)
    assert sv["tokens_per_s"] <= sv["upper_bound_tokens_per_s"] and "devices" not in free["replicas"][0]


@pytest.mark.parametrize(
    "target,message",
    [
        ("tokens", "serving.unrestricted.tokens_per_s"),
        ("bound", "serving.unrestricted.upper_bound_tokens_per_s"),
        ("concurrency", "serving.unrestricted.replicas[0].tokens_per_s"),
        ("null", "serving.unrestricted: null, but options.exportable"),
        ("pattern", "serving.unrestricted.replicas[0].pattern"),
    ],
)
def test_verify_refuses_a_forged_unrestricted_plan(base, target, message):
    def forge(d):
        free = d["serving"]["unrestricted"]
        if target == "tokens":
            free["tokens_per_s"] *= 1.5
        elif target == "bound":
            free["upper_bound_tokens_per_s"] *= 1.5
        elif target == "concurrency":
            free["replicas"][0]["concurrency"] += 1
        elif target == "null":
            d["serving"]["unrestricted"] = None
        else:
            free["replicas"][0]["pattern"] = "8xH100[tp8]"

    assert message in _forged_claim(base, forge)


def test_version_5_plans_are_still_read(base):
    folder, data = base

    def older(d):
        d["version"] = 5
        del d["serving"]["unrestricted"]

    path = _edited(folder, data, older)
    code, out = _run(["show", str(path)])
    assert code == 0 and "without --exportable" not in out, out
    code, out = _run(["show", str(_edited(folder, data, lambda d: d.update(version=4)))])
    assert code == 2 and "version 5 or 6" in out


def test_show_prints_what_the_engines_limits_cost(base):
    folder, data = base
    code, out = _run(["show", str(_edited(folder, data, lambda d: None))])
    flat = " ".join(out.split())
    free = data["serving"]["unrestricted"]
    assert code == 0 and f"without --exportable vllm: {free['tokens_per_s']:,.0f} output tokens/s" in flat, flat


def test_verify_refuses_a_forged_pattern_text(base):
    def forge(d):
        d["serving"]["replicas"][0]["pattern"] = "8xH100[tp8]"

    assert "serving.replicas[0].pattern" in _forged_claim(base, forge)


def test_verify_refuses_options_the_layout_breaks(base):
    _, data = base
    assert any(sum(s["stages"] for s in r["segments"]) >= 2 for r in data["serving"]["replicas"])

    def forge(d):
        d["options"]["max_stages"] = 1

    assert "options.max_stages is 1" in _forged_claim(base, forge)


@pytest.mark.slow  # re-derives every replica at each forged split: over a minute on 2 cores
def test_verify_refuses_a_forged_number_of_layers(base):
    def forge(d):
        d["model"]["num_layers"] = 40
        for rep in d["serving"]["replicas"]:
            rep["layers"][-1] += 8
        for b in [*d["baselines"].values(), d["serving"]["unrestricted"]]:
            for rep in b["replicas"]:
                rep["layers"][-1] += 8

    assert "model.num_layers: 40" in _forged_claim(base, forge)
    folder, data = base
    code, out = _run(["export", str(_edited(folder, data, forge)), "--to", "vllm"])
    assert code == 2 and "model.num_layers: 40 (and dense_layers 0), but llama2-7b has 32 layers" in " ".join(
        out.split()
    ), out


@pytest.mark.heavy  # verifies a forged plan's every replica in full: half a minute on 2 cores
def test_a_forged_concurrency_is_named_and_not_blamed_on_the_model(base):
    """A replica's concurrency raised past what a replica may hold is named as such; one raised within
    it gives figures over the bound, which the problems listed before explain (no "model defect")."""

    def huge(d):
        d["serving"]["replicas"][0]["concurrency"] = 10**9

    claim = _forged_claim(base, huge)
    assert "serving.replicas[0].concurrency: 1,000,000,000 is over the 1,048,576 sequences" in claim
    assert "a model defect" not in claim

    def more(d):
        d["serving"]["replicas"][0]["concurrency"] *= 4

    claim = _forged_claim(base, more)
    assert "serving.replicas[0].tokens_per_s" in claim and "a model defect" not in claim


@pytest.mark.parametrize("value", [-1, 1.5, "many", None, float("nan")])
def test_verify_refuses_malformed_statistics(base, value):
    def forge(d):
        d["serving"]["layouts_evaluated"] = value

    assert "serving.layouts_evaluated" in _forged_claim(base, forge)


def test_statistics_that_cannot_be_rederived_are_accepted_when_well_formed(base):
    folder, data = base

    def change(d):
        d["serving"]["solve_time_s"] *= 1.5
        d["serving"]["layouts_evaluated"] += 1

    assert _run(["verify", str(_edited(folder, data, change))])[0] == 0


@pytest.mark.parametrize("edit", ["empty", "removed"])
def test_a_placement_plan_without_the_cluster_hash_is_refused(tmp_path, edit):
    plan = written_plan(tmp_path)
    data = yaml.safe_load(plan.read_text())
    if edit == "empty":
        data["inputs"]["cluster_sha256"] = ""
    else:
        del data["inputs"]["cluster_sha256"]
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out = _run(["verify", str(plan)])
    assert code == 2 and "inputs.cluster_sha256" in out and str(plan) in " ".join(out.split()), out


def test_a_forged_placement_graph_file_is_refused_before_it_is_parsed(tmp_path):
    plan = written_plan(tmp_path)
    data = yaml.safe_load(plan.read_text())
    secret = _write(tmp_path, f'{{"name": "{SECRET}", "tasks": [{SECRET}', "other.json")
    data["inputs"]["model"]["graph"] = str(secret)
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out = _run(["verify", str(plan)])
    assert code == 2 and SECRET not in out and "sha256 differs" in out, out
    del data["inputs"]["model_file_sha256"]
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out = _run(["verify", str(plan)])
    assert code == 2 and "inputs.model_file_sha256: missing" in out, out


ONE_BOX = """name: one-box
device_kinds:
  - {name: g, type: gpu, peak_flops: {fp16: 165 TFLOP/s}, mem_bytes: 24 GB, mem_bw_bytes_per_s: 1000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us}
nodes:
  - {name: box, devices: {g: 2}, links: [{between: [g, g], bw_bytes_per_s: 25 GB/s, latency_s: 10 us}]}
"""
PROFILE = (
    "format: serving-profile/1\nmodel: gpt2\ndtype: fp16\nsource: constructed\nkinds:\n  g:\n"
    "    decode_layer_s: [[1, 0.001], [64, 0.0012], [256, 0.003]]\n    prefill_layer_s: [[0, 0], [512, 0.002]]\n"
)


@pytest.mark.heavy
def test_measured_profiles_and_model_configs_verify_and_are_hashed(tmp_path):
    """The verifier's own arithmetic takes a profile's measured block time, as the search does; a
    changed profile or config.json is refused before it is parsed, naming the hash's field."""
    (tmp_path / "c.yaml").write_text(ONE_BOX)
    profile = _write(tmp_path, PROFILE, "p.yaml")
    (tmp_path / "model").mkdir()
    config = _write(tmp_path / "model", emit(CONFIG_LLAMA), "config.json")
    # the targets: each model's plan at 100 ms, with bounds a third as long to compute and to verify
    for model, slo, extra, changed, field in (
        ("gpt2", "20 ms", ["--profile", str(profile)], profile, "inputs.profile_sha256"),
        (str(tmp_path / "model"), "5 ms", [], config, "inputs.model_sha256"),
    ):
        plan = tmp_path / "plan.yaml"
        argv = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", model, "--objective", "serving"]
        argv += ["--prompt-len", "64", "--output-len", "64", "--tpot-slo", slo, "-o", str(plan), *extra]
        assert _run(argv)[0] == 0
        code, out = _run(["verify", str(plan)])
        assert code == 0, out
        original = changed.read_text()
        changed.write_text(original + "\n")
        code, out = _run(["verify", str(plan)])
        assert code == 2 and field in out, out
        changed.write_text(original)


@pytest.mark.parametrize(
    "target, scale",
    [
        pytest.param(  # a stage-time bug in the search's cost tables (plans in full: slow)
            "llm_planner.serving.costs.StageCosts.stage_s", 0.8, marks=pytest.mark.slow
        ),
        ("llm_planner.serving.costs.StageCosts.mem_bytes", 0.5),  # a memory bug: more sequences fit than do
    ],
)
@pytest.mark.heavy
def test_a_modelling_bug_in_the_search_is_caught_by_verify(tmp_path, monkeypatch, target, scale):
    """verify computes stage times and memory with its own arithmetic from the cost layer, not with
    the search's stage costs: with a bug in those, the search's plan does not verify (the bug still
    there while verify runs)."""
    module, cls, name = target.rsplit(".", 2)
    owner = getattr(__import__(module, fromlist=[cls]), cls)
    right = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda self, *a, **k: right(self, *a, **k) * scale)
    spec, plan = write_fleet(tmp_path), tmp_path / "plan.yaml"
    argv = ["plan", "--cluster", str(spec), "--model", "llama2-7b", "--objective", "serving"]
    # at 30 ms the plan's layout is the one at 50 ms, its bounds take two thirds of the time
    argv += ["--tpot-slo", "30 ms", "--prompt-len", "256", "--output-len", "128", "-o", str(plan)]
    assert _run(argv)[0] == 0
    code, out = _run(["verify", str(plan)])
    assert code == 1, out
    assert ("stage_s: differs" if name == "stage_s" else "mem_bytes: differs") in out, out


def test_a_concurrency_past_the_token_budget_is_refused(base):
    """The planner keeps a micro-batch's decodes and their prompt share within the per-iteration
    token budget, and for vLLM the whole concurrency too (its --max-num-seqs may not pass
    --max-num-batched-tokens); a plan edited past either fails verify naming the field, and the
    export, which verifies first, writes no command."""
    folder, data = base
    c = data["serving"]["replicas"][0]["concurrency"]

    def shrink(d):
        d["options"]["max_batched_tokens"] = c - 1

    path = _edited(folder, data, shrink)
    code, out = _run(["verify", str(path)])
    flat = " ".join(out.split())
    assert code == 1 and "Traceback" not in out, flat
    assert f"serving.replicas[0].concurrency: {c:,} in" in flat and f"overruns the token budget of {c - 1:,}" in flat
    assert f"above the token budget of {c - 1:,}, which vLLM refuses" in flat
    code, out = _run(["export", str(path), "--to", "vllm"])
    flat = " ".join(out.split())
    assert code == 2 and "no vllm script written" in flat and "which vLLM refuses" in flat, flat
