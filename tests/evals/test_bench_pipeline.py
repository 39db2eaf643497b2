"""`tts bench pipeline` at a tiny size: the report's structure and a trace Perfetto opens."""

from __future__ import annotations

import json

from evals.bench_pipeline import PipelineBenchConfig, bench_pipeline


def test_bench_pipeline_tiny_generate_writes_report_and_two_stage_trace(tmp_path):
    bench = PipelineBenchConfig(num_prompts=2, new_tokens=4, rounds=1, workloads=("generate",), switches=False,
                                attention_backend="torch", out_dir=tmp_path)
    report = bench_pipeline(bench, command="tts bench pipeline (test)", log=lambda line: None)

    rows = report.summary["workloads"]["generate"]
    assert list(rows) == ["pp1 1 thread", "pp1 2 threads", "pp2 sarathi", "pp2 throttle"]
    for label, row in rows.items():
        assert row["tokens_per_s"] > 0 and len(row["tokens_per_s_each_round"]) == 1
        low, median, high = row["microbatch_tokens_min_median_max"]
        assert 1 <= low <= median <= high
        assert len(row["stages"]) == (2 if label.startswith("pp2") else 0)
        for stage in row["stages"]:
            assert 0 < stage["busy"] <= 1 and abs(stage["busy"] + stage["idle"] - 1) < 1e-9
    # Two in flight at most in a pipeline of two; at least one whenever something launched.
    assert 1 <= rows["pp2 throttle"]["mean_in_flight"] <= 2
    assert [t["target"] for t in report.summary["targets"]][0].startswith("PP2 throttle >= 1.3x")

    payload = json.loads(report.json_path.read_text())
    assert payload["command"] == "tts bench pipeline (test)" and "machine" in payload
    assert "| generate | pp2 throttle |" in report.markdown_path.read_text()
    trace = json.loads(report.trace_path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert {e["cat"] for e in spans} >= {"compute", "wait"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
