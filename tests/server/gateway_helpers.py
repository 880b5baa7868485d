"""Real clusters for the `smelt gateway` tests: `smelt serve` nodes as child processes on
free ports (CPU, one thread each, a short context so several fit in memory) and a gateway in
front of them, configured by a TOML file written here. Used by test_gateway_*.py and by
bench/gateway/bench.py. Every wait has a deadline and fails loudly with the process's log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from conftest import free_port

NODE_KEY = "k-node"
ADMIN_KEY = "k-admin"


def fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def wait_for(what: str, check: Callable[[], bool], timeout: float, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            fail(f"{what} within {timeout:.0f} s\n--- log ---\n{log()}")
        time.sleep(0.1)


class Proc:
    """A child process with its output in a temporary file."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.logfile = tempfile.NamedTemporaryFile(prefix="smelt-", suffix=".log", delete=False)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdout=self.logfile, stderr=subprocess.STDOUT, env=self.env
        )

    def log(self) -> str:
        return Path(self.logfile.name).read_text(errors="replace")[-6000:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Node(Proc):
    """`smelt serve --no-model` (or with `models`) on a fixed free port, admin key NODE_KEY."""

    def __init__(self, smelt_bin: str, models_dir: str, *args: str, models: tuple = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model_args = [a for m in models for a in ("--model", m)] or ["--no-model"]
        env = dict(os.environ, SMELT_MODELS=models_dir)
        super().__init__(
            [smelt_bin, "serve", *model_args, "--port", str(self.port), "--threads", "1",
             "--ctx", "512", "--admin-key", NODE_KEY, *args],
            env,
        )

    def start(self) -> None:
        super().start()

        def live() -> bool:
            if not self.alive():
                fail(f"smelt serve exited early:\n{self.log()}")
            return httpx.get(self.url + "/live", timeout=2).status_code == 200

        wait_for(f"smelt serve on {self.url} answered /live", live, 120, self.log)


class Gateway(Proc):
    """`smelt gateway` over `nodes` with the catalogue `models` ([[model]] tables as dicts)."""

    def __init__(self, smelt_bin: str, nodes: dict[str, Node], models: list[dict],
                 node_mb: int | None = None, api_keys: list[str] | None = None,
                 interval_ms: int = 200) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.nodes = nodes
        lines = ["[gateway]", f'admin_key = "{ADMIN_KEY}"', f"health_interval_ms = {interval_ms}"]
        if api_keys:
            lines.append("api_keys = [" + ", ".join(f'"{k}"' for k in api_keys) + "]")
        for name, n in nodes.items():
            lines += ["", "[[node]]", f'name = "{name}"', f'url = "{n.url}"',
                      f'admin_key = "{NODE_KEY}"']
            if node_mb is not None:
                lines.append(f"memory_mb = {node_mb}")
        for m in models:
            lines += ["", "[[model]]"]
            for k, v in m.items():
                lines.append(f"{k} = {toml_value(v)}")
        self.config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.config.write("\n".join(lines) + "\n")
        self.config.close()
        super().__init__([smelt_bin, "gateway", "--config", self.config.name,
                          "--port", str(self.port)])
        self.admin = self.admin_client()

    def admin_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=300,
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})

    def start(self) -> None:
        if self.admin.is_closed:
            self.admin = self.admin_client()
        super().start()
        wait_for(f"smelt gateway on {self.url} saw its nodes up", self.all_up, 60, self.log)

    def node_states(self) -> dict[str, dict]:
        r = self.admin.get("/admin/nodes")
        assert r.status_code == 200, r.text
        return {n["name"]: n for n in r.json()["data"]}

    def all_up(self) -> bool:
        return all(n["state"] == "up" for n in self.node_states().values())

    def placement(self) -> dict[str, dict[str, str]]:
        """node -> {model: state} (loaded, loading, unloading)."""
        return {name: {m["id"]: m["state"] for m in n["models"]}
                for name, n in self.node_states().items()}

    def where(self, model: str) -> list[str]:
        """The nodes where `model` is loaded, as /v1/models says."""
        r = self.admin.get(f"/v1/models/{model}")  # the admin key opens /v1/* too
        assert r.status_code == 200, r.text
        return sorted(r.json()["loaded_on"])

    def settle(self, timeout: float = 60) -> None:
        """Waits until no load or unload is in progress anywhere."""
        wait_for("every load and unload finished",
                 lambda: all(s == "loaded" for p in self.placement().values() for s in p.values()),
                 timeout, self.log)

    def stop(self) -> None:
        super().stop()
        self.admin.close()


def toml_value(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return str(v)
