"""What a replica has served, kept on disk as the run goes (llm_planner.runtime.serve_progress): lines appended
at most every interval with only what is new, read back as the raw record has it, a line cut short dropped."""

from __future__ import annotations

import json

from llm_planner.runtime.serve_progress import Progress, clear_progress, progress_path, read_progress


def _request(i: int) -> dict:
    return {"index": i, "token_s": [0.1 * i, 0.1 * i + 0.05], "arrival_s": 0.0, "tokens": [i, i + 1]}


def test_lines_hold_what_is_new_at_most_every_interval_and_read_back_as_one_record(tmp_path):
    progress = Progress(tmp_path, 3, interval_s=0.5)
    finished, iterations = [], [[0.0, 0.1, False, 4, 1]]
    assert not progress.update(0.2, finished, iterations, _request)  # before the interval
    finished.append(0)
    assert progress.update(0.6, finished, iterations, _request)
    assert not progress.update(1.5, finished, iterations, _request)  # nothing new
    finished += [1, 2]
    iterations.append([0.6, 0.7, True, 1, 1])
    assert not progress.update(0.9, finished, iterations, _request)  # new, but within the interval
    assert progress.update(1.6, finished, iterations, _request)
    lines = progress_path(tmp_path, 3).read_text().splitlines()
    assert [len(json.loads(line)["requests"]) for line in lines] == [1, 2]  # only what is new
    assert read_progress(tmp_path) == [
        {
            "replica": 3,
            "requests": [_request(0), _request(1), _request(2)],
            "iterations": iterations,
            "duration_s": 1.6,
        }
    ]


def test_a_line_cut_short_ends_the_record_and_a_new_run_starts_afresh(tmp_path):
    progress = Progress(tmp_path, 0, interval_s=0.0)
    progress.update(0.1, [0], [], _request)
    with open(progress_path(tmp_path, 0), "a") as f:
        f.write('{"replica": 0, "at_s": 0.3, "requests": [{"ind')  # the rank killed while writing
    (record,) = read_progress(tmp_path)
    assert record["requests"] == [_request(0)] and record["duration_s"] == 0.1
    Progress(tmp_path, 0)  # the same workdir's next run: the old record goes
    assert read_progress(tmp_path) == []
    clear_progress(tmp_path)
    assert not progress_path(tmp_path, 0).exists()


def test_a_record_that_cannot_be_written_stops_without_stopping_the_run(tmp_path, caplog):
    progress = Progress(tmp_path / "missing", 0, interval_s=0.0)
    assert not progress.update(0.1, [0], [], _request)
    assert "the record of what replica 0 served stops here" in caplog.text


def test_the_members_of_a_data_parallel_replica_write_their_own_files_read_back_as_one_record(tmp_path):
    """Each member of a dpaK replica schedules its own requests and keeps its own file; read back (and in the
    ranks' raw record: serve_record.merge_records), the replica's requests and iterations are all of theirs,
    iterations by when they were sent, the duration the longest."""
    members = [Progress(tmp_path, 1, interval_s=0.0, member=j) for j in range(2)]
    members[0].update(0.4, [0], [[0.0, 0.1, False, 4, 1]], _request)
    members[1].update(0.7, [1], [[0.05, 0.2, False, 4, 1]], _request)
    Progress(tmp_path, 0, interval_s=0.0).update(0.3, [2], [[0.0, 0.3, False, 4, 1]], _request)
    assert {p.name for p in tmp_path.iterdir()} == {
        "served.replica0.jsonl",
        "served.replica1.member0.jsonl",
        "served.replica1.member1.jsonl",
    }
    records = read_progress(tmp_path)
    assert [r["replica"] for r in records] == [0, 1]
    assert records[1] == {
        "replica": 1,
        "duration_s": 0.7,
        "requests": [_request(0), _request(1)],
        "iterations": [[0.0, 0.1, False, 4, 1], [0.05, 0.2, False, 4, 1]],
    }
    clear_progress(tmp_path)
    assert not list(tmp_path.iterdir())
