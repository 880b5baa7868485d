#!/usr/bin/env python3
"""Aggregate decode throughput of `smelt serve` under N concurrent streams (issue 15's
"8 / 32 / 64 sequences" rows): at each concurrency N, N clients start together, each streams
one completion of a PROMPT-token prompt (token ids, different per client) for exactly
MAX_TOKENS tokens (greedy, `ignore_eos`), and the table gives the generated tokens per second
over the wall time of the round (from the server's own usage counts), the median time to first
token, and the median per-stream decode rate.

Python's standard library only (the GPU machine has no network to install anything), so it
runs wherever the binary is carried. Either point it at a running server (--url) or let it
start one (--serve "COMMAND"; port 0, it reads the address the server prints) and stop it
at the end.

  bench/server/concurrency.py --serve "target/release/smelt serve -m M.gguf --device cuda \\
      --max-batch 64" --levels 1,8,32,64
  bench/server/concurrency.py --url http://127.0.0.1:8080 --levels 8 --json

Exit status 1 when any request fails or returns fewer tokens than asked (never a partial
table that reads as a result).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8080")
    where.add_argument(
        "--serve",
        help="the command that starts the server (`--port 0` is added); it is stopped at the end",
    )
    p.add_argument("--levels", default="1,8,32,64", help="concurrencies to run (default 1,8,32,64)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per request (default 128)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request (default 128)")
    p.add_argument("--model", help="model id (default: the server's first)")
    p.add_argument("--rounds", type=int, default=1, help="rounds per level; the median is reported (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds a request may take (default 600)")
    p.add_argument("--json", action="store_true", help="one JSON line per level instead of the table")
    a = p.parse_args()
    try:
        a.levels = [int(x) for x in a.levels.split(",") if x.strip()]
    except ValueError:
        p.error("--levels takes numbers separated by commas, e.g. 1,8,32")
    if not a.levels or min(a.levels) < 1 or a.prompt < 1 or a.max_tokens < 1 or a.rounds < 1:
        p.error("--levels, --prompt, --max-tokens and --rounds must be at least 1")
    return a


def start_server(command: str) -> tuple[subprocess.Popen, str]:
    """Starts `command --port 0` and returns it with the URL it prints on stderr."""
    argv = shlex.split(command) + ["--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            # Keep draining stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1)
    proc.wait()
    sys.exit("the server exited before listening:\n" + "".join(seen[-30:]))


def request(url: str, method: str, path: str, body: dict | None, timeout: float):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    conn.request(method, path, body=data, headers=headers)
    return conn, conn.getresponse()


def first_model(url: str, timeout: float) -> str:
    try:
        conn, r = request(url, "GET", "/v1/models", None, timeout)
    except OSError as e:
        sys.exit(f"cannot reach {url}: {e}")
    body = r.read()
    conn.close()
    if r.status != 200:
        sys.exit(f"/v1/models answered {r.status}: {body[:300]!r}")
    return json.loads(body)["data"][0]["id"]


def scheduler_us(url: str, timeout: float) -> tuple[float, float]:
    """The server's forward and scheduler-busy microseconds so far (`/metrics`, summed over
    models); (0, 0) when it does not report them."""
    try:
        conn, r = request(url, "GET", "/metrics", None, timeout)
        text = r.read().decode()
        conn.close()
    except OSError:
        return 0.0, 0.0
    sums = {"smelt_forward_microseconds_total": 0.0, "smelt_scheduler_busy_microseconds_total": 0.0}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums["smelt_forward_microseconds_total"], sums["smelt_scheduler_busy_microseconds_total"]


def prompt_ids(client: int, n: int) -> list[int]:
    # Ordinary ids below 30,100 (inside every real vocabulary), different for every client.
    return [100 + (j * 7919 + client * 104729) % 30000 for j in range(n)]


def stream_one(url: str, body: dict, timeout: float, start: threading.Barrier, out: dict) -> None:
    """One streamed completion: its start, first-token and end times and the usage count."""
    try:
        start.wait()
        t0 = time.perf_counter()
        conn, r = request(url, "POST", "/v1/completions", body, timeout)
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return
        first = None
        usage = None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = str(chunk["error"])
                return
            if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
        conn.close()
        out.update(t0=t0, first=first or time.perf_counter(), end=time.perf_counter(), usage=usage)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none is swallowed
        out["error"] = f"{type(e).__name__}: {e}"


def one_round(url: str, model: str, n: int, a: argparse.Namespace) -> dict:
    fwd0, busy0 = scheduler_us(url, a.timeout)
    barrier = threading.Barrier(n)
    outs: list[dict] = [{} for _ in range(n)]
    threads = []
    for k in range(n):
        body = {
            "model": model,
            "prompt": prompt_ids(k, a.prompt),
            "max_tokens": a.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t = threading.Thread(target=stream_one, args=(url, body, a.timeout, barrier, outs[k]))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        sys.exit(f"{len(errors)} of {n} requests failed, e.g.: {errors[0]}")
    for o in outs:
        got = (o["usage"] or {}).get("completion_tokens")
        if got != a.max_tokens:
            sys.exit(f"a request generated {got} tokens, not {a.max_tokens}: {o['usage']}")
    wall = max(o["end"] for o in outs) - min(o["t0"] for o in outs)
    total = sum(o["usage"]["completion_tokens"] for o in outs)
    ttft = [o["first"] - o["t0"] for o in outs]
    # A stream's decode rate: its tokens after the first over the time after the first.
    per_stream = [(a.max_tokens - 1) / max(o["end"] - o["first"], 1e-9) for o in outs]
    # The scheduler's host share: its busy time outside the engine's forwards (the batch is
    # empty once every stream ended, so its last step's time is counted).
    time.sleep(0.05)
    fwd1, busy1 = scheduler_us(url, a.timeout)
    busy = busy1 - busy0
    return {
        "host_share": (busy - (fwd1 - fwd0)) / busy if busy > 0 else None,
        "tok_s": total / wall,
        "wall_s": wall,
        "ttft_ms": 1e3 * statistics.median(ttft),
        "stream_tok_s": statistics.median(per_stream),
    }


def main() -> None:
    a = parse_args()
    proc = None
    url = a.url
    if a.serve:
        proc, url = start_server(a.serve)
    try:
        model = a.model or first_model(url, a.timeout)
        # One short request first: weights touched, kernels loaded.
        one_round(url, model, 1, argparse.Namespace(**{**vars(a), "max_tokens": 4, "prompt": 8}))
        if not a.json:
            print(f"server {url}  model {model}  prompt {a.prompt} tokens, {a.max_tokens} generated each")
            print("| streams | tokens/s (aggregate) | per stream tokens/s | median TTFT ms | wall s |")
            print("|---:|---:|---:|---:|---:|")
        for n in a.levels:
            rounds = [one_round(url, model, n, a) for _ in range(a.rounds)]
            best = sorted(rounds, key=lambda r: r["tok_s"])[len(rounds) // 2]
            if a.json:
                print(json.dumps({"streams": n, "prompt_tokens": a.prompt, "max_tokens": a.max_tokens,
                                  "model": model, **best}), flush=True)
            else:
                print(f"| {n} | {best['tok_s']:.1f} | {best['stream_tok_s']:.1f} | "
                      f"{best['ttft_ms']:.1f} | {best['wall_s']:.2f} |", flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
