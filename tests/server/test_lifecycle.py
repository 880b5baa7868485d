"""Shutdown as issue 4 asks: SIGTERM/SIGINT stop accepting, let in-flight work finish or cancel
within the grace period, close every connection and exit 0."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from conftest import extra_server_process


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_streams_and_exits_zero(smelt_bin: str, model_path: str, sig: int) -> None:
    with extra_server_process(smelt_bin, model_path, "--grace", "2") as (url, proc):
        body = {"messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True}
        outcome: dict[str, object] = {}
        started = threading.Event()

        def stream() -> None:
            try:
                with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                    outcome["status"] = r.status_code
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            json.loads(line[6:])
                            started.set()
                outcome["ended"] = "closed"
            except httpx.HTTPError as e:  # a cut connection is an end too, not a hang
                outcome["ended"] = f"error: {type(e).__name__}"
            started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(60), "the stream never started"
        t0 = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        took = time.monotonic() - t0
        t.join(timeout=30)
        assert not t.is_alive(), "the client connection hung after shutdown"
        assert code == 0, f"smelt serve exited {code} on {signal.Signals(sig).name}"
        assert took < 2 + 8, f"shutdown took {took:.1f} s with --grace 2"
        assert outcome.get("status") == 200
        assert "ended" in outcome
