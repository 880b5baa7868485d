"""Schemathesis on `/openapi.json` (issue 17): requests generated from the server's own API
description, valid and not, find no 5xx and no response that breaks the described schema.

A server of its own, with a short context (`--ctx 64`) so every generated request is quick
whatever `max_tokens`/`n` it asks for, and an admin key (admin answers 401 instead of letting
generated bodies unload the model). A bounded number of examples per operation keeps the run
to about half a minute on two cores (about 200 requests). Schemathesis lives in its own venv (scripts/server-tests.sh
installs it and sets SMELT_SCHEMATHESIS to its `st`)."""

from __future__ import annotations

import os
import subprocess

from conftest import extra_server, required_env

EXAMPLES = os.environ.get("SMELT_SCHEMATHESIS_EXAMPLES", "30")


def test_schemathesis_finds_no_5xx_and_no_schema_violation(smelt_bin, model_path, tmp_path) -> None:
    st = required_env("SMELT_SCHEMATHESIS")
    assert os.access(st, os.X_OK), f"SMELT_SCHEMATHESIS={st} is not an executable"
    with extra_server(smelt_bin, model_path, "--ctx", "64", "--admin-key", "k-admin") as url:
        run = subprocess.run(
            [st, "run", f"{url}/openapi.json",
             "--checks", "not_a_server_error,response_schema_conformance",
             "--phases", "examples,fuzzing", "--max-examples", EXAMPLES, "--seed", "17",
             "--workers", "2", "--request-timeout", "120", "--generation-database", "none",
             "--no-color", "--report", "junit", "--report-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=900, cwd=tmp_path,
        )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    print(out[-1500:])
