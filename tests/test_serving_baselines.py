"""The serving baselines are solved once per plan: every layout they score is evaluated once, whichever
baseline (engineer-best's variants, megatron) or the search asks for it again."""

from __future__ import annotations

import collections

from serving_fixtures import write_fleet

from llm_planner.cli.main import main
from llm_planner.serving.replica import ReplicaModel


def test_each_baseline_layout_is_evaluated_once_per_plan(tmp_path, monkeypatch, capsys):
    calls: collections.Counter = collections.Counter()
    best = ReplicaModel.best

    def counted(self, micro_batches=None, fixed=None, refine=False):
        layout = tuple((s.costs.server_class.name, s.costs.degree) for s in self.slots)
        calls[(layout, tuple(micro_batches or ()), fixed, refine)] += 1
        return best(self, micro_batches, fixed, refine)

    monkeypatch.setattr(ReplicaModel, "best", counted)
    argv = ["plan", "--cluster", str(write_fleet(tmp_path)), "--model", "llama2-7b", "--objective", "serving"]
    argv += ["--prompt-len", "256", "--output-len", "128", "--tpot-slo", "50 ms", "-o", str(tmp_path / "p.yaml")]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "megatron" in out and "engineer-best" in out  # both baselines were scored
    fixed = [key for key in calls if key[2] is not None]  # the even splits: engineer-best's and megatron's
    assert fixed, calls
    assert {key: n for key, n in calls.items() if n > 1} == {}
