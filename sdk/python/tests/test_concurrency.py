"""One client used from several threads at once, infer_async futures (also under asyncio), and
the GIL released while a request is in flight."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import cloister
from conftest import CLS, REC, assert_matches_reference, reference_sets

CLS_OUTPUT = "softmax_0.tmp_0"


def cls_cases():
    """The classifier's reference sets (upright, rotated): distinct inputs with distinct
    answers, so a reply delivered to the wrong caller is caught."""
    return [(inputs, expected[CLS_OUTPUT]) for inputs, expected in reference_sets(CLS)]


def run_threads(client, model, cases, thread_count, calls_per_thread):
    errors = []
    results = [[] for _ in range(thread_count)]

    def worker(index):
        try:
            for call in range(calls_per_thread):
                case = (index + call) % len(cases)
                outputs = client.infer(model, cases[case][0])
                results[index].append((case, outputs[CLS_OUTPUT]))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(thread_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not errors, errors
    return results


def test_several_threads_share_one_client(client, cls_model):
    cases = cls_cases()
    results = run_threads(client, cls_model, cases, thread_count=8, calls_per_thread=6)
    for per_thread in results:
        assert len(per_thread) == 6
        for case, actual in per_thread:
            assert_matches_reference(actual, cases[case][1], f"case {case}")


@pytest.mark.slow
def test_many_threads_many_calls(client, cls_model):
    cases = cls_cases()
    results = run_threads(client, cls_model, cases, thread_count=32, calls_per_thread=25)
    for per_thread in results:
        for case, actual in per_thread:
            assert_matches_reference(actual, cases[case][1], f"case {case}")


def test_infer_async_returns_futures(client, cls_model):
    cases = cls_cases()
    futures = [client.infer_async(cls_model, cases[i % 2][0]) for i in range(20)]
    for i, future in enumerate(futures):
        assert_matches_reference(future.result(timeout=120)[CLS_OUTPUT], cases[i % 2][1], str(i))


def test_infer_async_copies_inputs_before_returning(client, cls_model):
    (inputs, expected), _ = cls_cases()
    x = inputs["x"].copy()
    future = client.infer_async(cls_model, {"x": x})
    x[...] = 0  # the caller reuses its buffer at once
    assert_matches_reference(future.result(timeout=120)[CLS_OUTPUT], expected, "async")


def test_infer_async_reports_errors_through_the_future(client, cls_model):
    future = client.infer_async(cls_model, {"wrong_name": np.zeros((1, 3, 48, 192), np.float32)})
    with pytest.raises(cloister.InvalidArgument):
        future.result(timeout=120)
    assert isinstance(future.exception(), cloister.InvalidArgument)


def test_infer_async_under_asyncio(client, cls_model):
    cases = cls_cases()

    async def main():
        calls = [asyncio.wrap_future(client.infer_async(cls_model, cases[i % 2][0]))
                 for i in range(10)]
        return await asyncio.gather(*calls)

    for i, outputs in enumerate(asyncio.run(main())):
        assert_matches_reference(outputs[CLS_OUTPUT], cases[i % 2][1], str(i))


def test_another_thread_runs_while_a_request_is_in_flight(client, rec_model):
    """A request holds no GIL while it waits: a pure-Python thread keeps ticking through it.
    (Were the GIL held, the ticker would stall for the whole request.)"""
    crop = reference_sets(REC)[0][0]["x"]
    batch = 4
    while True:
        x = np.repeat(crop, batch, axis=0)
        started = time.monotonic()
        client.infer(rec_model, {"x": x})
        if time.monotonic() - started >= 0.3 or batch >= 64:
            break
        batch *= 2

    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            sum(range(2000))  # pure-Python work: needs the GIL

    window = {}

    def request():
        window["start"] = time.monotonic()
        client.infer(rec_model, {"x": x})
        window["end"] = time.monotonic()

    ticking = threading.Thread(target=ticker)
    ticking.start()
    time.sleep(0.05)
    requesting = threading.Thread(target=request)
    requesting.start()
    requesting.join(timeout=120)
    stop.set()
    ticking.join()

    start, end = window["start"], window["end"]
    assert end - start >= 0.1, f"the request took only {end - start:.3f} s"
    inside = [t for t in ticks if start <= t <= end]
    # The ticker ran throughout: many ticks, and no gap near the length of the request.
    assert len(inside) >= 20, f"{len(inside)} ticks during a {end - start:.3f} s request"
    gaps = np.diff([start] + inside + [end])
    assert gaps.max() < 0.5 * (end - start), (
        f"the ticker stalled for {gaps.max():.3f} s of a {end - start:.3f} s request")
