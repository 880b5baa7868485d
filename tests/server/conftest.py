"""Fixtures for the end-to-end tests of `smelt serve` (run by scripts/server-tests.sh).

The suite talks to servers the way users do: the official `openai` package for the API, and
plain HTTP (httpx, which `openai` brings) for what that package cannot send (bad JSON) or
does not expose (/metrics, /health, /admin). A missing prerequisite fails the test loudly.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: run the suite through scripts/server-tests.sh, which starts the server",
            pytrace=False,
        )
    return value


@pytest.fixture(scope="session")
def base_url() -> str:
    return required_env("SMELT_BASE_URL").rstrip("/")


@pytest.fixture(scope="session")
def smelt_bin() -> str:
    path = required_env("SMELT_BIN")
    if not os.access(path, os.X_OK):
        pytest.fail(f"SMELT_BIN={path} is not an executable", pytrace=False)
    return path


@pytest.fixture(scope="session")
def model_path() -> str:
    path = required_env("SMELT_MODEL_PATH")
    if not Path(path).is_file():
        pytest.fail(f"SMELT_MODEL_PATH={path} is not a file", pytrace=False)
    return path


def make_client(url: str, api_key: str = "unused") -> openai.OpenAI:
    # No retries: a 429 or 5xx must reach the test, not be hidden by the client's back-off.
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def client(base_url: str) -> openai.OpenAI:
    return make_client(base_url)


@pytest.fixture(scope="session")
def model_id(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert models, "the server lists no model"
    return models[0].id


@pytest.fixture(scope="session")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=300) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def extra_server(smelt_bin: str, model_path: str, *args: str) -> Iterator[str]:
    """A second `smelt serve` with its own flags (--api-key, --max-queue ...); yields its URL."""
    with extra_server_process(smelt_bin, model_path, *args) as (url, _):
        yield url


@contextlib.contextmanager
def extra_server_process(
    smelt_bin: str, model_path: str, *args: str
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Like extra_server, and yields the process too (for signal tests)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [smelt_bin, "serve", "--model", model_path, "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"smelt serve {' '.join(args)} exited early:\n{log.read().decode()}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"smelt serve {' '.join(args)} did not answer /health in 120 s")
                time.sleep(0.3)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parses Prometheus text exposition into (name, labels, value); any bad line fails."""
    samples = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        name, labels, value = m.groups()
        samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`; fails if it has none."""
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    found = [
        v
        for n, lab, v in parse_metrics(r.text)
        if n == name and all(lab.get(k) == want for k, want in labels.items())
    ]
    assert found, f"/metrics has no {name} {labels or ''}"
    return sum(found)
