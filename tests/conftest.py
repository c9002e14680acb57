"""Fixtures that start real nereid-server processes on 127.0.0.1.

Environment:
  NEREID_SERVER_BIN  path of the server binary (default: <repo>/target/debug/nereid-server)
  ORT_DYLIB_PATH     libonnxruntime.so for the server (default: the one inside the
                     venv's onnxruntime wheel, onnxruntime/capi/libonnxruntime.so.*)

Every server is started with ephemeral ports, its output is captured by a
background thread (and written to <pytest tmp>/<name>.log), and at teardown it
gets SIGTERM and must exit with code 0 within 30 s.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import helpers  # noqa: E402
from helpers import (  # noqa: E402
    BROKEN_REPO_MODELS,
    EXAMPLES_MODELS,
    SMALL_GRPC_MAX_MESSAGE,
    SMALL_HTTP_MAX_INPUT,
    NereidServer,
)

EXIT_TIMEOUT_ARGS = ["--exit-timeout-secs", "10"]


def pytest_configure(config: pytest.Config) -> None:
    helpers.ensure_ort_dylib_env()


def pytest_report_header(config: pytest.Config) -> list[str]:
    import os

    binary = os.environ.get("NEREID_SERVER_BIN") or str(helpers.DEFAULT_SERVER_BIN)
    return [
        f"nereid-server: {binary}",
        f"ORT_DYLIB_PATH: {os.environ.get('ORT_DYLIB_PATH') or '(not found)'}",
    ]


def _require_example_models() -> None:
    missing = [
        str(EXAMPLES_MODELS / m / "1" / "model.onnx")
        for m in ("simple", "mlp_small")
        if not (EXAMPLES_MODELS / m / "1" / "model.onnx").is_file()
    ]
    if missing:
        pytest.fail(
            "example ONNX models missing: " + ", ".join(missing)
            + " — run `.venv/bin/python examples/generate_models.py`",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """Server on examples/models, model control mode none (everything loaded)."""
    _require_example_models()
    srv = helpers.launch(
        tmp_path_factory, "main", [EXAMPLES_MODELS],
        ["--model-control-mode", "none", *EXIT_TIMEOUT_ARGS],
    )
    yield srv
    srv.stop_and_check()


@pytest.fixture(scope="session")
def http_client(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        server.http_url, connection_timeout=helpers.TIMEOUT, network_timeout=helpers.TIMEOUT
    )
    yield client
    client.close()


@pytest.fixture(scope="session")
def grpc_client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def explicit_server(tmp_path_factory):
    """Explicit model control on a private copy of examples/models; only
    `identity` is loaded at start-up. The copy is `explicit_server.repos[0]`."""
    _require_example_models()
    repo = helpers.private_repo(tmp_path_factory, "explicit_repo")
    srv = helpers.launch(
        tmp_path_factory, "explicit", [repo],
        ["--model-control-mode", "explicit", "--load-model", "identity", *EXIT_TIMEOUT_ARGS],
    )
    yield srv
    srv.stop_and_check()


@pytest.fixture(scope="session")
def explicit_http_client(explicit_server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        explicit_server.http_url, connection_timeout=helpers.TIMEOUT, network_timeout=helpers.TIMEOUT
    )
    yield client
    client.close()


@pytest.fixture(scope="session")
def explicit_grpc_client(explicit_server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def small_server(tmp_path_factory):
    """examples/models with tight request limits and a custom server name."""
    _require_example_models()
    srv = helpers.launch(
        tmp_path_factory, "small", [EXAMPLES_MODELS],
        [
            "--http-max-input-size", str(SMALL_HTTP_MAX_INPUT),
            "--grpc-max-message-size", str(SMALL_GRPC_MAX_MESSAGE),
            "--server-name", "nereid-small",
            *EXIT_TIMEOUT_ARGS,
        ],
    )
    yield srv
    srv.stop_and_check()


@pytest.fixture(scope="session")
def broken_repo_server(tmp_path_factory):
    """Mode none on a repository holding good and broken models.

    Only /v2/health/live is awaited (server readiness may legitimately be
    false while some models failed); then the index must settle.
    """
    _require_example_models()
    repo = tmp_path_factory.mktemp("broken_repo") / "models"
    repo.mkdir()
    shutil.copytree(EXAMPLES_MODELS / "simple", repo / "simple")
    helpers.make_model_dir(repo, "auto_simple", config=None)
    helpers.make_model_dir(repo, "bad_syntax", config=helpers.broken_syntax_pbtxt("bad_syntax"))
    helpers.make_model_dir(repo, "bad_dtype", config=helpers.simple_config_pbtxt("bad_dtype", "TYPE_FP32"))
    srv = helpers.launch(
        tmp_path_factory, "broken_repo", [repo],
        ["--model-control-mode", "none", *EXIT_TIMEOUT_ARGS],
        wait_for="live",
    )
    try:
        helpers.wait_for_index(
            srv,
            lambda idx: all(
                idx.get(m, {}).get("state") in ("READY", "UNAVAILABLE") for m in BROKEN_REPO_MODELS
            ),
        )
    except AssertionError as exc:
        srv.stop()
        pytest.fail(srv.describe(f"broken-repo server: {exc}"), pytrace=False)
    yield srv
    srv.stop_and_check()


SERVER_FIXTURES = ("server", "explicit_server", "small_server", "broken_repo_server")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failed test, attach the tail of each involved server's output."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for name in SERVER_FIXTURES:
        srv = funcargs.get(name)
        if not isinstance(srv, NereidServer) or srv.proc is None:
            continue
        rc = srv.proc.poll()
        state = f"EXITED with code {rc}" if rc is not None else f"running, pid {srv.pid}"
        report.sections.append(
            (f"{name} ({state}; log {srv.log_path}) last 40 lines", srv.output(40))
        )
