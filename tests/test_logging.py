"""Triton's logging extension: /v2/logging and gRPC LogSettings change what
the server logs while it runs."""

from __future__ import annotations

import json
import time

import pytest
import tritonclient.grpc as grpcclient

import helpers
from helpers import EXAMPLES_MODELS, NereidServer

KEYS = {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}


@pytest.fixture
def log_server(tmp_path):
    srv = NereidServer([EXAMPLES_MODELS], ["--exit-timeout-secs", "10"], log_path=tmp_path / "log.log").start()
    yield srv
    srv.stop_and_check()


def _infer(server: NereidServer) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    assert helpers.post_infer(server, "identity", body).status_code == 200


def _lines_after(server: NereidServer, mark: int) -> list[str]:
    """The lines logged since `mark`, once the reader thread had time to
    catch up (for checking that something was not logged)."""
    time.sleep(0.5)
    return server.output().splitlines()[mark:]


def _wait_for_line(server: NereidServer, mark: int, needle: str, timeout: float = 10.0) -> list[str]:
    """The lines logged since `mark`, as soon as one contains `needle`."""
    deadline = time.monotonic() + timeout
    while True:
        lines = server.output().splitlines()[mark:]
        if any(needle in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_verbose_level_changes_what_is_logged_without_a_restart(log_server):
    settings = helpers.http_get(log_server, "/v2/logging").json()
    assert set(settings) == KEYS
    assert settings["log_verbose_level"] == 0 and settings["log_format"] == "default"
    mark = len(log_server.output().splitlines())
    _infer(log_server)
    assert not any("inference done" in line for line in _lines_after(log_server, mark))

    updated = helpers.http_post(log_server, "/v2/logging", json={"log_verbose_level": 1}).json()
    assert updated["log_verbose_level"] == 1
    mark = len(log_server.output().splitlines())
    _infer(log_server)
    assert any("inference done" in line for line in _wait_for_line(log_server, mark, "inference done"))

    # Back off over gRPC, with tritonclient.
    client = grpcclient.InferenceServerClient(log_server.grpc_url)
    try:
        client.update_log_settings({"log_verbose_level": 0})
        assert client.get_log_settings(as_json=True)["settings"]["log_verbose_level"]["uint32_param"] in (0, None)
    finally:
        client.close()
    mark = len(log_server.output().splitlines())
    _infer(log_server)
    assert not any("inference done" in line for line in _lines_after(log_server, mark))


def test_an_instance_threads_line_about_a_request_carries_its_id(log_server):
    """The request's span travels with it to the instance thread: what that
    thread logs about the request names it."""
    helpers.http_post(log_server, "/v2/logging", json={"log_verbose_level": 1})
    mark = len(log_server.output().splitlines())
    a, b = helpers.simple_inputs()
    body = helpers.simple_json_request(a, b)
    body["id"] = "req-on-the-instance-42"
    assert helpers.post_infer(log_server, "simple", body).status_code == 200
    lines = _wait_for_line(log_server, mark, "taken up by an instance")
    taken = [line for line in lines if "taken up by an instance" in line]
    assert taken, lines
    assert "req-on-the-instance-42" in taken[0] and "simple" in taken[0], taken[0]


def test_json_format_and_severities_switch_live(log_server):
    helpers.http_post(log_server, "/v2/logging", json={"log_format": "json", "log_verbose_level": 1})
    mark = len(log_server.output().splitlines())
    _infer(log_server)
    lines = [line for line in _wait_for_line(log_server, mark, "inference done") if line.strip()]
    assert lines, "no log line after switching to JSON"
    events = [json.loads(line) for line in lines]
    assert any(e["fields"]["message"] == "inference done" for e in events), events
    # Only errors: a failing request's debug line is gone too.
    helpers.http_post(
        log_server, "/v2/logging",
        json={"log_format": "default", "log_info": False, "log_warning": False, "log_verbose_level": 0},
    )
    mark = len(log_server.output().splitlines())
    helpers.post_infer(log_server, "identity", {"inputs": []})
    assert _lines_after(log_server, mark) == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"log_info": "yes"}, "'log_info' must be a boolean"),
        ({"log_verbose_level": -1}, "log_verbose_level"),
        ({"log_verbose_level": True, "log_info": False}, "log_verbose_level"),
        ({"log_format": "xml"}, "log_format"),
        ({"log_colour": True}, "unknown log setting 'log_colour'"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(log_server, change, needle):
    helpers.assert_setting_refused(log_server, "/v2/logging", change, needle)


def test_log_file_is_unsupported(log_server):
    resp = helpers.http_post(log_server, "/v2/logging", json={"log_file": "/tmp/nereid.log"})
    helpers.assert_http_error(resp, 501, contains=["log_file"])
