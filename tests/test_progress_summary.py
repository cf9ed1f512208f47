"""The end-of-run summary says how well the optimizer kept up with its rollout workers."""

from __future__ import annotations

from rapid.run.progress import balance_lines


def test_summary_reports_use_waste_reuse_and_staleness():
    last = {"samples_received": 1000, "samples_used": 960, "samples_dropped_stale": 30, "samples_evicted_unused": 10,
            "sample_reuse": 0.96, "balance_target_reuse": 1.0, "staleness_p50": 1.0, "staleness_p99": 4.0}
    text = "\n".join(balance_lines(last))
    assert "96.0% of received samples" in text and "3.0% dropped stale" in text and "1.0% evicted" in text
    assert "target 1.00: within 10%" in text and "p50 1, p99 4" in text
    assert "off by more than 10%" in "\n".join(balance_lines({**last, "sample_reuse": 0.5}))


def test_summary_of_an_older_log_leaves_the_new_lines_out():
    assert balance_lines({"samples_received": 10, "sample_reuse": 1.2}) == ["  sample reuse       : 1.20"]
