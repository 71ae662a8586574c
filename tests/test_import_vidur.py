"""`llm-planner import vidur`: Vidur's operator CSVs (written here in its layout) -> serving-profile/2,
its tables checked by hand; missing files and columns exit 2 naming them."""

from __future__ import annotations

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.cost.serving_profile import load_serving_profile
from llm_planner.cost.vidur import OPERATORS

MODEL = "meta-llama/Meta-Llama-3-8B"
OPS_HEADER = ",".join(f"time_stats.{op}.median" for op in OPERATORS)


def _mlp_row(tokens: int, tp: int, ms_each: float) -> str:
    return ",".join([str(ms_each)] * len(OPERATORS)) + f",32,8,{tokens},{tp}"


def write_vidur(root, *, all_reduce: bool = True, mlp_header: str | None = None):
    mlp = root / "data/profiling/compute/a100" / MODEL / "mlp.csv"
    mlp.parent.mkdir(parents=True)
    header = mlp_header or f"{OPS_HEADER},n_head,n_kv_head,num_tokens,num_tensor_parallel_workers"
    rows = [
        _mlp_row(1, 1, 0.01),  # 9 operators x 0.01 ms = 0.09 ms
        _mlp_row(8, 1, 0.02),
        _mlp_row(8, 1, 0.04),  # re-profiled: the mean of the two, 9 x 0.03 ms
        _mlp_row(1, 2, 0.005),
        _mlp_row(8, 2, 0.01),
    ]
    mlp.write_text("\n".join([header, *rows]) + "\n")
    if all_reduce:
        net = root / "data/profiling/network/a100_dgx/all_reduce.csv"
        net.parent.mkdir(parents=True)
        lines = [
            ",time_stats.all_reduce.median,rank,num_workers,size,collective,devices_per_node",
            "0,0.02,0,2,2048,all_reduce,2",
            "1,0.04,0,2,2048,all_reduce,2",  # re-profiled: 0.03 ms
            "2,0.05,0,2,3072,all_reduce,2",  # not the size nearest a power of two: left out
            "3,0.06,0,2,4096,all_reduce,2",
            "4,9.0,0,2,4096,all_reduce,1",  # two nodes: not a tensor-parallel group
            "5,9.0,0,4,4096,all_reduce,4",  # a degree mlp.csv does not have
            "6,9.0,0,2,4096,send_recv,2",
        ]
        net.write_text("\n".join(lines) + "\n")
    return mlp


def _import(tmp_path, *extra):
    out = tmp_path / "profile.yaml"
    return main(
        ["import", "vidur", str(tmp_path / "vidur"), "--gpu", "a100", "--model", MODEL, "-o", str(out), *extra]
    ), out


def test_import_vidur_writes_the_summed_operator_medians_and_the_all_reduce_per_degree(tmp_path):
    write_vidur(tmp_path / "vidur")
    rc, out = _import(tmp_path)
    assert rc == 0
    p = load_serving_profile(out)
    assert p.version == 2 and p.model == MODEL and p.dtype == "fp16"
    assert "attention from the kernel model (attention.csv absent)" in p.source
    one, two = p.tables("a100", 1), p.tables("a100", 2)
    assert one.linear.sizes == (1, 8) and one.linear.seconds == pytest.approx((9 * 0.01e-3, 9 * 0.03e-3))
    assert one.linear_includes_elementwise and one.all_reduce is None and one.attn_decode is None
    assert two.linear.seconds == pytest.approx((9 * 0.005e-3, 9 * 0.01e-3))
    assert two.all_reduce.sizes == (2048, 4096) and two.all_reduce.seconds == pytest.approx((0.03e-3, 0.06e-3))
    assert p.tables("a100", 4) is None
    rc, out = _import(tmp_path, "--kind", "a100-40g")
    assert rc == 0 and load_serving_profile(out).tables("a100-40g", 2) is not None


def test_single_device_profiles_need_no_all_reduce_file(tmp_path):
    mlp = write_vidur(tmp_path / "vidur", all_reduce=False)
    mlp.write_text("\n".join(mlp.read_text().splitlines()[:4]) + "\n")  # tp 1 rows only
    rc, out = _import(tmp_path)
    assert rc == 0 and [d.degree for d in load_serving_profile(out).kinds[0].degrees] == [1]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda root, mlp: mlp.unlink(), "mlp.csv: no such file"),
        (
            lambda root, mlp: mlp.write_text(mlp.read_text().replace("time_stats.add.median", "add")),
            "mlp.csv: missing column(s) time_stats.add.median",
        ),
        (
            lambda root, mlp: mlp.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\n"),
            "mlp.csv: a Git LFS pointer",
        ),
        (
            lambda root, mlp: (root / "data/profiling/network/a100_dgx/all_reduce.csv").unlink(),
            "all_reduce.csv: no such file",
        ),
        (
            lambda root, mlp: mlp.write_text(mlp.read_text().replace(",32,8,8,1\n", ",32,8,x,1\n", 1)),
            "mlp.csv: line 3: num_tokens: expected a whole number, got 'x'",
        ),
        (
            lambda root, mlp: mlp.write_text(mlp.read_text().replace(",32,8,8,1\n", ",32,8,8.5,1\n", 1)),
            "mlp.csv: line 3: num_tokens: expected a whole number, got '8.5'",
        ),
        (
            lambda root, mlp: mlp.write_text(mlp.read_text().replace(",32,8,8,1\n", ",32,8,8\n", 1)),
            "mlp.csv: line 3: 12 fields, the header has 13",
        ),
        (
            lambda root, mlp: mlp.write_text(mlp.read_text().replace(",32,8,8,1\n", ",32,8,8,1,7\n", 1)),
            "mlp.csv: line 3: 14 fields, the header has 13",
        ),
    ],
)
def test_missing_files_and_columns_exit_2_naming_them(tmp_path, capsys, change, message):
    root = tmp_path / "vidur"
    change(root, write_vidur(root))
    rc, out = _import(tmp_path)
    err = capsys.readouterr().err.replace("\n", "")
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "gpu, extra, message", [("../a100", [], "--gpu '../a100'"), ("a100", ["--kind", "a/b"], "--kind")]
)
def test_bad_names_exit_2(tmp_path, capsys, gpu, extra, message):
    write_vidur(tmp_path / "vidur")
    argv = ["import", "vidur", str(tmp_path / "vidur"), "--gpu", gpu, "--model", MODEL]
    assert main([*argv, "-o", str(tmp_path / "p.yaml"), *extra]) == 2
    assert message in capsys.readouterr().err.replace("\n", "")


def test_a_table_it_reads_is_not_written_over(tmp_path, capsys):
    """-o naming a file of the profiling folder read is refused and the table kept; a new file there,
    or one outside, is written."""
    mlp = write_vidur(tmp_path / "vidur")
    before = mlp.read_text()
    argv = ["import", "vidur", str(tmp_path / "vidur"), "--gpu", "a100", "--model", MODEL]
    assert main([*argv, "-o", str(mlp)]) == 2
    assert "the folder of Vidur's tables this command reads" in capsys.readouterr().err
    assert mlp.read_text() == before
    assert main([*argv, "-o", str(mlp.parent / "profile.yaml")]) == 0


def test_the_written_profile_plans_and_verifies(tmp_path):
    write_vidur(tmp_path / "vidur")
    rc, profile = _import(tmp_path, "--kind", "g")
    assert rc == 0
    (tmp_path / "c.yaml").write_text(
        "name: one-box\ndevice_kinds:\n  - {name: g, type: gpu, peak_flops: {fp16: 165 TFLOP/s}, mem_bytes: 24 GB,\n"
        "     mem_bw_bytes_per_s: 1000 GB/s}\nnodes:\n  - {name: box, devices: {g: 2},\n"
        "     links: [{between: [g, g], bw_bytes_per_s: 25 GB/s, latency_s: 10 us}]}\n"
    )
    plan = tmp_path / "plan.yaml"
    argv = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--objective", "serving", "--tpot-slo", "60 ms"]
    argv += ["--prompt-len", "64", "--output-len", "64", "--profile", str(profile), "-o", str(plan)]
    assert main([*argv, "--model", "llama3-8b"]) == 0 and main(["verify", str(plan)]) == 0
    assert yaml.safe_load(profile.read_text())["format"] == "serving-profile/2"


def test_a_profile_of_a_model_with_other_layers_is_refused(tmp_path, capsys, caplog):
    """The profile times Llama-3 8B's GEMMs and attention; Llama-3 70B's layers are wider, so its
    times do not stand for them: refused naming both shapes. The same layers under another name
    (Llama-3.1 8B) are used, with a warning."""
    write_vidur(tmp_path / "vidur")
    _, profile = _import(tmp_path, "--kind", "g")
    (tmp_path / "c.yaml").write_text(
        "name: one-box\ndevice_kinds:\n  - {name: g, type: gpu, peak_flops: {fp16: 165 TFLOP/s}, mem_bytes: 80 GB,\n"
        "     mem_bw_bytes_per_s: 1000 GB/s}\nnodes:\n  - {name: box, devices: {g: 8},\n"
        "     links: [{between: [g, g], bw_bytes_per_s: 25 GB/s, latency_s: 10 us}]}\n"
    )
    argv = ["score", "--cluster", str(tmp_path / "c.yaml"), "--prompt-len", "64", "--output-len", "64"]
    argv += ["--concurrency", "8", "--profile", str(profile)]
    assert main([*argv, "--model", "llama3-70b", "--replica", "1 x box/g[tp8]"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "it times the layers of 'meta-llama/Meta-Llama-3-8B' (hidden 4096, MLP 14336" in err
    assert "llama3-70b has other layers (hidden 8192, MLP 28672" in err and "Traceback" not in err
    assert main([*argv, "--model", "llama3.1-8b", "--replica", "1 x box/g"]) == 0
    assert "only if the two are the same model under other names" in caplog.text


def test_a_time_falling_with_more_tokens_is_raised_and_said(tmp_path, caplog):
    """Noisy medians: the 8-token row a little faster than the 1-token one would extend the table
    below zero past its end; it is raised to the time before it, with a warning."""
    mlp = write_vidur(tmp_path / "vidur")
    rows = [r for r in mlp.read_text().splitlines() if not r.endswith(",8,1")]
    mlp.write_text("\n".join([*rows, _mlp_row(8, 1, 0.0099)]) + "\n")
    rc, out = _import(tmp_path)
    assert rc == 0
    one = load_serving_profile(out).tables("a100", 1)
    assert one.linear.seconds == pytest.approx((9 * 0.01e-3, 9 * 0.01e-3))
    assert "1 of 2 times fall below the one before them" in caplog.text


@pytest.mark.parametrize(
    "ms, message",
    [("0", "a time of 0 at 1"), ("4e6", "expected milliseconds up to an hour")],
)
def test_a_time_of_nothing_or_of_hours_is_refused(tmp_path, capsys, ms, message):
    mlp = write_vidur(tmp_path / "vidur")
    rows = [r for r in mlp.read_text().splitlines() if not r.endswith(",1,1")]
    mlp.write_text("\n".join([*rows, _mlp_row(1, 1, float(ms))]) + "\n")
    rc, out = _import(tmp_path)
    err = capsys.readouterr().err.replace("\n", "")
    assert rc == 2 and "mlp.csv" in err and message in err and not out.exists(), err


def test_a_byte_order_mark_is_read_past_and_a_column_named_twice_is_refused(tmp_path, capsys):
    mlp = write_vidur(tmp_path / "vidur")
    mlp.write_text("\ufeff" + mlp.read_text())
    rc, out = _import(tmp_path)
    assert rc == 0 and load_serving_profile(out).tables("a100", 1) is not None
    header, *rows = mlp.read_text().removeprefix("\ufeff").splitlines()
    mlp.write_text("\n".join([header + ",num_tokens", *(r + ",1" for r in rows)]) + "\n")
    rc, out = _import(tmp_path)
    err = capsys.readouterr().err.replace("\n", "")
    assert rc == 2 and "column(s) named twice in the header: num_tokens" in err, err
