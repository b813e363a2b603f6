"""The one load runner of `mha loadtest`, for every kind of request: `count` requests sent by `concurrency` threads,
one kept-alive connection each, until all are sent or `max_seconds` pass. What a request is, how it is sent and
judged, is the caller's (loadtest.py: attention shots; gpt/loadtest.py: generations)."""
from __future__ import annotations

import http.client
import itertools
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from mha_runtime.artifact.errors import first_line

Request = TypeVar("Request")
Outcome = TypeVar("Outcome")


def run_pool(host: str, port: int, requests: Callable[[int], Request], *,
             send: Callable[[http.client.HTTPConnection, int, Request], Outcome],
             lost: Callable[[int, Request, float, str], Outcome], reconnect: Callable[[Outcome], bool],
             count: int, concurrency: int, max_seconds: float, timeout_s: float) -> tuple[list[Outcome], float]:
    """Send requests 0..count-1; every outcome (in completion order) and the wall time. No new request starts after
    `max_seconds`. When `send` raises (no whole answer came), the outcome is `lost(index, request, seconds, why)`;
    after an outcome for which `reconnect` is true the connection is replaced (the server may have closed it)."""
    indices, lock = itertools.count(), threading.Lock()
    outcomes: list[Outcome] = []
    start = time.perf_counter()

    def worker() -> None:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
        while True:
            with lock:
                i = next(indices)
            if i >= count or time.perf_counter() - start > max_seconds:
                break
            request = requests(i)
            sent = time.perf_counter()
            try:
                outcome = send(connection, i, request)
            except (OSError, http.client.HTTPException) as exc:
                outcome = lost(i, request, time.perf_counter() - sent, f"{type(exc).__name__}: {first_line(exc)}")
            if reconnect(outcome):
                connection.close()
                connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
            with lock:
                outcomes.append(outcome)
        connection.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes, time.perf_counter() - start
