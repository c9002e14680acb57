"""Prometheus metrics on the metrics port, in Triton's names, scraped with
the real Prometheus text parser (prometheus_client) and checked against the
load sent and against the statistics extension.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import helpers
from helpers import EXAMPLES_MODELS, HOST, NereidServer

SLOW = """name: "slow"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value: { string_value: "100" } }
dynamic_batching { max_queue_delay_microseconds: 1000
  default_queue_policy { max_queue_size: 2 allow_timeout_override: true } }
"""


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory):
    repo = helpers.private_repo(tmp_path_factory, "metrics_repo")
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW)
    srv = helpers.launch(
        tmp_path_factory,
        "metrics",
        [repo],
        ["--metrics-config", "summary_latencies=true", "--metrics-config", "histogram_latencies=true",
         "--metrics-interval-ms", "200", "--exit-timeout-secs", "10"],
    )
    yield srv
    srv.stop_and_check()


def scrape(server: NereidServer) -> dict:
    """{family name: family} from one scrape, parsed by prometheus_client."""
    text = requests.get(server.metrics_url, timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, family: str, name: str | None = None, **labels) -> float | None:
    for s in families[family].samples if family in families else []:
        if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_families_have_tritons_names_and_types(metrics_server):
    families = scrape(metrics_server)
    expected = {
        "nv_inference_request_success": "counter",
        "nv_inference_request_failure": "counter",
        "nv_inference_count": "counter",
        "nv_inference_exec_count": "counter",
        "nv_inference_pending_request_count": "gauge",
        "nereid_inference_executing_request_count": "gauge",
        "nv_inference_request_duration_us": "counter",
        "nv_inference_queue_duration_us": "counter",
        "nv_inference_compute_input_duration_us": "counter",
        "nv_inference_compute_infer_duration_us": "counter",
        "nv_inference_compute_output_duration_us": "counter",
        "nv_inference_request_summary_us": "summary",
        "nv_inference_queue_histogram_us": "histogram",
        "nv_model_load_duration_secs": "gauge",
        "nv_cpu_utilization": "gauge",
        "nv_cpu_memory_total_bytes": "gauge",
        "nv_cpu_memory_used_bytes": "gauge",
        "nereid_requests_in_flight": "gauge",
    }
    for name, kind in expected.items():
        # prometheus_client strips a counter's _total; ours have none.
        assert name in families, f"{name} missing; have {sorted(families)}"
        assert families[name].type == kind, (name, families[name].type)
    load = sample(families, "nv_model_load_duration_secs", model="simple", version="1")
    assert load is not None and load > 0
    assert 0 < sample(families, "nv_cpu_memory_used_bytes") <= sample(families, "nv_cpu_memory_total_bytes")


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def test_counters_equal_the_load_sent_and_the_statistics(metrics_server):
    http = httpclient.InferenceServerClient(metrics_server.http_url)
    grpc = grpcclient.InferenceServerClient(metrics_server.grpc_url)
    before = scrape(metrics_server)
    labels = {"model": "simple", "version": "1"}

    def value(families, family, **extra):
        return sample(families, family, **labels, **extra) or 0.0

    good, batch = 7, 3
    a, b = helpers.simple_inputs(batch)
    for i in range(good):
        if i % 2:
            http.infer("simple", helpers.simple_http_inputs(a, b))
        else:
            inputs = [grpcclient.InferInput("INPUT0", [batch, 16], "INT32"), grpcclient.InferInput("INPUT1", [batch, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            grpc.infer("simple", inputs)
    # OTHER: requests the model cannot take (wrong shape, too large a batch).
    bad_shape = [httpclient.InferInput("INPUT0", [1, 15], "INT32"), httpclient.InferInput("INPUT1", [1, 15], "INT32")]
    for t in bad_shape:
        t.set_data_from_numpy(np.zeros((1, 15), dtype=np.int32))
    for _ in range(2):
        with pytest.raises(InferenceServerException):
            http.infer("simple", bad_shape)

    after = scrape(metrics_server)
    stats = _stats(http, "simple")
    success = value(after, "nv_inference_request_success") - value(before, "nv_inference_request_success")
    other = value(after, "nv_inference_request_failure", reason="OTHER") - value(
        before, "nv_inference_request_failure", reason="OTHER"
    )
    assert success == good
    assert other == 2
    assert value(after, "nv_inference_count") - value(before, "nv_inference_count") == good * batch
    assert value(after, "nv_inference_exec_count") - value(before, "nv_inference_exec_count") == good
    # Equal to the statistics extension, which counts the same events.
    assert value(after, "nv_inference_request_success") == stats["inference_stats"]["success"]["count"]
    failures = sum(
        value(after, "nv_inference_request_failure", reason=r) for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    )
    assert failures == stats["inference_stats"]["fail"]["count"]
    assert value(after, "nv_inference_count") == stats["inference_count"]
    assert value(after, "nv_inference_exec_count") == stats["execution_count"]
    duration_us = value(after, "nv_inference_request_duration_us")
    assert abs(duration_us - stats["inference_stats"]["success"]["ns"] / 1000) <= value(
        after, "nv_inference_request_success"
    ), "microsecond counters sum the same durations (each rounded down)"
    assert sample(after, "nv_inference_request_summary_us", "nv_inference_request_summary_us_count", **labels) == (
        value(after, "nv_inference_request_success")
    )
    http.close()
    grpc.close()


def test_rejections_and_cancellations_have_their_reasons(metrics_server):
    """REJECTED: a full queue (max_queue_size 2, 100 ms per execution);
    CANCELED: clients that give up before their answer."""
    labels = {"model": "slow", "version": "1"}
    before = scrape(metrics_server)
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}

    def send(_):
        return helpers.post_infer(metrics_server, "slow", body).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(send, range(16)))
    rejected_sent = statuses.count(503)
    assert rejected_sent > 0 and statuses.count(200) > 0, statuses

    for _ in range(3):
        with pytest.raises(requests.Timeout):
            requests.post(metrics_server.base_url + "/v2/models/slow/infer", json=body, timeout=0.02)
    time.sleep(1.0)  # the abandoned requests run out their queue and execution
    after = scrape(metrics_server)

    def delta(reason):
        return (sample(after, "nv_inference_request_failure", reason=reason, **labels) or 0) - (
            sample(before, "nv_inference_request_failure", reason=reason, **labels) or 0
        )

    assert delta("REJECTED") == rejected_sent
    assert delta("CANCELED") == 3
    stats = _stats(httpclient.InferenceServerClient(metrics_server.http_url), "slow")
    failures = sum(
        sample(after, "nv_inference_request_failure", reason=r, **labels) or 0
        for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    )
    assert failures == stats["inference_stats"]["fail"]["count"]


def test_queue_and_executing_gauges_rise_under_load_and_return_to_zero(metrics_server):
    labels = {"model": "slow", "version": "1"}
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    stop = threading.Event()
    seen = {"pending": 0.0, "executing": 0.0, "in_flight": 0.0}

    def watch():
        while not stop.is_set():
            families = scrape(metrics_server)
            seen["pending"] = max(seen["pending"], sample(families, "nv_inference_pending_request_count", **labels) or 0)
            seen["executing"] = max(
                seen["executing"], sample(families, "nereid_inference_executing_request_count", **labels) or 0
            )
            seen["in_flight"] = max(seen["in_flight"], sample(families, "nereid_requests_in_flight", protocol="http") or 0)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(lambda _: helpers.post_infer(metrics_server, "slow", body), range(9)))
    stop.set()
    watcher.join(timeout=10)
    assert seen["pending"] > 0 and seen["executing"] > 0 and seen["in_flight"] > 0, seen
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        idle = scrape(metrics_server)
        values = [
            sample(idle, "nv_inference_pending_request_count", **labels),
            sample(idle, "nereid_inference_executing_request_count", **labels),
        ]
        if values == [0.0, 0.0]:
            break
        time.sleep(0.1)
    assert values == [0.0, 0.0], values


def test_an_unloaded_model_leaves_the_metrics_and_a_scrape_during_unload_works(explicit_server):
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    http.load_model("simple")
    assert sample(scrape(explicit_server), "nv_inference_request_success", model="simple", version="1") == 0
    stop = threading.Event()
    failures = []

    def scrape_loop():
        while not stop.is_set():
            r = requests.get(explicit_server.metrics_url, timeout=10)
            if r.status_code != 200:
                failures.append(r.status_code)

    scraper = threading.Thread(target=scrape_loop)
    scraper.start()
    http.unload_model("simple")
    time.sleep(0.2)
    stop.set()
    scraper.join(timeout=10)
    assert not failures
    assert sample(scrape(explicit_server), "nv_inference_request_success", model="simple") is None
    assert http.is_model_ready("identity")
    http.close()


def test_a_taken_metrics_port_is_a_clear_startup_error():
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                str(helpers.server_binary()), "--model-repository", str(EXAMPLES_MODELS),
                "--http-address", HOST, "--http-port", "0", "--grpc-address", HOST, "--grpc-port", "0",
                "--metrics-address", HOST, "--metrics-port", str(port),
            ],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode != 0
    assert f"--metrics-port {port}" in result.stderr and "in use" in result.stderr, result.stderr[-2000:]


def test_metrics_off_serves_no_port(tmp_path):
    log = tmp_path / "off.log"
    srv = NereidServer([EXAMPLES_MODELS], ["--allow-metrics=false"], log_path=log).start()
    try:
        assert srv.metrics_port is None
        assert "Started Metrics Service" not in srv.output()
        helpers.assert_simple_works(srv)
    finally:
        srv.stop_and_check()


def test_the_grafana_dashboard_queries_only_metrics_the_server_exports(metrics_server):
    import json
    import re

    from helpers import REPO_ROOT

    helpers.assert_simple_works(metrics_server)
    helpers.post_infer(metrics_server, "simple", {"inputs": []})  # a failure, so the failure family has samples
    exported = set(scrape(metrics_server))
    dashboard = json.loads((REPO_ROOT / "deploy" / "grafana" / "nereid-inference.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"\b((?:nv|nereid)_[a-z_]+)\b", e)}
    assert names, "the dashboard queries nothing?"
    missing = names - exported
    assert not missing, f"the dashboard queries metrics the server does not export: {sorted(missing)}"
