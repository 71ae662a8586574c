"""Numbers and text from files (issue 26), each defect by its first example: an integer beyond
float range in any file is refused naming its field; a model config.json beyond the documented
limits, with a bad norm epsilon, rotary base or activation, is refused in seconds; values from
files are printed literally (no rich markup, control characters escaped)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from plan_files import written_plan

from llm_planner.cli.main import main
from llm_planner.core.fmt import LiteralConsole, printable, quote, styled

CLUSTER = str(Path(__file__).resolve().parents[1] / "cluster_specs" / "localhost-2cpu.yaml")
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the command line; no traceback (a hang is caught by the suite's timeout)."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _plan_config(tmp_path: Path, capsys, text: str) -> tuple[int, str, str]:
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(text)
    argv = ["plan", "--cluster", CLUSTER, "--model", str(model), "--no-baselines", "-o", str(tmp_path / "p.yaml")]
    return _run(argv, capsys)


@pytest.mark.parametrize("command", ["verify", "show"])
def test_an_overlong_integer_in_a_plan_is_refused_naming_the_field(tmp_path, capsys, command):
    path = written_plan(tmp_path)
    path.write_text(re.sub(r"^objective_s: .*$", "objective_s: " + "9" * 400, path.read_text(), count=1, flags=re.M))
    code, _, err = _run([command, str(path)], capsys)
    assert code == 2 and "plan.yaml: objective_s: an integer of 400 digits, beyond the range of a float" in err


def test_an_overlong_integer_in_a_config_json_is_refused_naming_the_key(tmp_path, capsys):
    code, _, err = _plan_config(tmp_path, capsys, json.dumps(LLAMA)[:-1] + ', "rms_norm_eps": ' + "9" * 400 + "}")
    assert code == 2 and "config.json: rms_norm_eps: an integer of 400 digits" in err


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("num_hidden_layers", 1_000_000, "num_layers 1,000,000 is above the limit of 1,024"),
        ("vocab_size", 10**12, "vocab_size 1,000,000,000,000 is above the limit of 4,194,304"),
        ("_name_or_path", "x" * 1_000_000, "is longer than 256 characters (1,000,000), the limit"),
        ("rms_norm_eps", -1e-6, "norm_eps must be a finite number in (0, 1], got -1e-06"),
        ("rms_norm_eps", 0, "norm_eps must be a finite number in (0, 1], got 0.0"),
        ("hidden_act", "nonsense", "activation 'nonsense' is not one transformers knows"),
        ("rope_theta", -5.0, "rope_theta must be a finite number above 0, got -5.0"),
    ],
)
def test_a_config_json_beyond_the_limits_or_with_a_bad_value_is_refused_in_seconds(tmp_path, capsys, key, value, says):
    code, _, err = _plan_config(tmp_path, capsys, json.dumps({**LLAMA, key: value}))
    assert code == 2 and "config.json: " in err and says in err
    assert len(err) < 2000  # a 1 MB name is not quoted whole


def test_a_non_finite_norm_epsilon_in_a_config_json_is_refused(tmp_path, capsys):
    code, _, err = _plan_config(tmp_path, capsys, json.dumps(LLAMA)[:-1] + ', "layer_norm_epsilon": NaN}')
    assert code == 2 and "config.json: layer_norm_epsilon: nan is not a finite number" in err


def test_markup_in_a_model_name_and_a_cluster_name_is_printed_literally(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(Path(CLUSTER).read_text().replace("name: localhost-2cpu", 'name: "c[b]d[/b]"', 1))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA, "_name_or_path": "a[/]b [red]c[/red]:smile:"}))
    argv = ["plan", "--cluster", str(cluster), "--model", str(model), "--no-baselines", "-o", str(tmp_path / "p.yaml")]
    code, out, _ = _run(argv, capsys)
    assert code == 0 and "a[/]b [red]c[/red]:smile:" in out and "c[b]d[/b]" in out


def test_an_escape_sequence_in_a_cluster_name_is_refused(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(Path(CLUSTER).read_text().replace("name: localhost-2cpu", 'name: "c\\e[2Jd"', 1))
    code, out, err = _run(["show-cluster", str(cluster)], capsys)
    assert code == 2 and f"{cluster}: name: 'c\\x1b[2Jd' holds a character that is not printable" in err
    assert "\x1b" not in out + err


def test_a_control_character_in_a_model_name_is_refused(tmp_path, capsys):
    code, _, err = _plan_config(tmp_path, capsys, json.dumps({**LLAMA, "_name_or_path": "a\x1b[2J"}))
    assert code == 2 and "name 'a\\x1b[2J' holds a control character" in err and "\x1b" not in err


def test_an_error_quoting_markup_prints_it_literally(tmp_path, capsys):
    code, _, err = _plan_config(tmp_path, capsys, json.dumps({**LLAMA, "hidden_act": "[/][red]x\x07"}))
    assert code == 2 and "activation '[/][red]x\\x07' is not one" in err and "\x07" not in err


def test_the_literal_console_reads_no_markup_and_escapes_controls():
    console = LiteralConsole(width=80, force_terminal=False, color_system=None)
    with console.capture() as captured:
        console.print("[bold]x[/] \x1b]0;title\x07 \u202eevil")
        console.print(styled(("ok", "green"), ": [/]\x1b"))
    assert captured.get() == "[bold]x[/] \\x1b]0;title\\x07 \\u202eevil\nok: [/]\\x1b\n"
    assert printable("a\tb\nc\r") == "a\tb\nc\\x0d"
    assert quote("y" * 1000) == repr("y" * 1000)[:80] + "... (1,002 characters)"


def _spec_error(edit) -> str:
    from input_mutations import CLUSTER as BASE

    from llm_planner.core.spec import SpecError, parse_cluster

    data = json.loads(json.dumps(BASE))
    edit(data)
    with pytest.raises(SpecError) as info:
        parse_cluster(data, source="cluster.yaml")
    return str(info.value)


def test_two_link_rules_for_one_pair_of_kinds_are_refused():
    def twice(data):
        rules = data["links"].setdefault("intra_node", [])
        rule = {"between": ["gpu0", "gpu0"], "bw_bytes_per_s": "1 GB/s", "latency_s": "1 us"}
        rules[:] = [*rules, rule, {**rule, "bw_bytes_per_s": "9 GB/s"}]

    assert "a second rule for kinds 'gpu0' and 'gpu0'" in _spec_error(twice)


def test_a_memory_below_one_byte_is_refused():
    def tiny(data):
        data["device_kinds"][0]["mem_bytes"] = 5e-324

    assert "cluster.yaml: device_kinds[0].mem_bytes: must be at least 1 byte, got 5e-324" in _spec_error(tiny)
