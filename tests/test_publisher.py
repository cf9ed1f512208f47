"""BackgroundWriter: order, at most one waiting job, drain on close, errors raised in the caller."""

from __future__ import annotations

import threading
import time

import pytest

from rapid.optimizer.publisher import BackgroundWriter


def test_jobs_run_in_order_and_close_drains():
    done = []
    writer = BackgroundWriter(on_done=lambda name, s: done.append(name))
    for v in range(5):
        writer.submit(f"v{v}", lambda v=v: time.sleep(0.01))
    writer.close()
    assert done == [f"v{v}" for v in range(5)]


def test_at_most_one_job_waits_and_optional_work_is_skipped_while_busy():
    gate = threading.Event()
    writer = BackgroundWriter()
    writer.submit("slow", gate.wait)
    assert not writer.try_submit("fold", lambda: None)          # busy: skipped, not queued
    writer.submit("second", lambda: None)                       # one may wait behind the running job
    third = threading.Thread(target=writer.submit, args=("third", lambda: None))
    third.start()
    third.join(0.2)
    assert third.is_alive()                                     # the third blocks: nothing piles up
    gate.set()
    third.join(5)
    assert not third.is_alive()
    writer.drain()
    assert writer.try_submit("fold", lambda: None)
    writer.close()


def test_a_failed_job_is_raised_in_the_caller_and_later_jobs_are_skipped():
    ran = []
    writer = BackgroundWriter()

    def boom():
        raise ValueError("refusing to publish v3")
    writer.submit("v3", boom)
    writer.drain()
    with pytest.raises(ValueError, match="v3"):
        writer.check()
    writer.submit("v4", lambda: ran.append(4))
    writer.close()
    assert ran == []
