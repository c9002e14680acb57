"""`--model-control-mode poll`: under a steady load of 16 clients, a new
version, a changed config, a removed version, a config that turns invalid
and a repository that vanishes are each picked up (or survived) with no
request failed, and answers switch to the version that should serve."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

import helpers

MODEL = "versioned"
SOURCE = helpers.TESTS_DIR / "python_models" / MODEL
CLIENTS = 16
POLL_SECS = 1
WITHIN_S = 60


class Load:
    """CLIENTS threads inferring MODEL's latest version without pause."""

    def __init__(self, url: str):
        self.url = url
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.answers: dict[int, int] = {}
        self.last = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        inputs = [httpclient.InferInput("INPUT0", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
        while not self.stop.is_set():
            try:
                version = int(client.infer(MODEL, inputs).as_numpy("VERSION")[0])
            except Exception as e:  # noqa: BLE001 - every failure counts
                with self.lock:
                    self.failures.append(repr(e))
                continue
            with self.lock:
                self.answers[version] = self.answers.get(version, 0) + 1
                self.last = version

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def served_by(self, version: int) -> int:
        """Waits until requests are answered by `version`; returns how many
        answers came before that."""
        deadline = time.monotonic() + WITHIN_S
        while True:
            with self.lock:
                if self.last == version:
                    return sum(self.answers.values())
            assert time.monotonic() < deadline, f"version {version} never answered: {self.answers}"
            time.sleep(0.05)


def eventually(check, what: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WITHIN_S} s: {what}"
        time.sleep(0.1)


def replace_file(path: Path, text: str) -> None:
    """Writes `text` to `path` atomically, as an editor or a deployment does."""
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(text)
    os.replace(temporary, path)


def test_poll_mode_follows_the_repository_with_no_request_failed(tmp_path):
    repo = tmp_path / "repo"
    model = repo / MODEL
    shutil.copytree(SOURCE, model)
    server = helpers.NereidServer(
        [repo], ["--model-control-mode", "poll", "--repository-poll-secs", str(POLL_SECS)],
        log_path=tmp_path / "server.log",
    ).start()
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        # The repository API cannot load or unload in poll mode, as in Triton.
        try:
            client.load_model(MODEL)
            raise AssertionError("load was accepted in poll mode")
        except httpclient.InferenceServerException as e:
            assert "polling is enabled" in str(e)

        with Load(server.http_url) as load:
            load.served_by(1)

            # A new version, copied aside and renamed in.
            shutil.copytree(model / "1", tmp_path / "incoming")
            os.rename(tmp_path / "incoming", model / "2")
            load.served_by(2)

            # A changed config: two instances.
            config = (model / "config.pbtxt").read_text()
            replace_file(model / "config.pbtxt", config.replace("count: 1", "count: 2"))
            eventually(lambda: client.get_model_config(MODEL)["instance_group"][0]["count"] == 2,
                       "the new config serves")

            # The version removed: the one before it serves again.
            shutil.rmtree(model / "2")
            load.served_by(1)

            # A config that turns invalid: the loaded one keeps serving, and
            # the index says why it was not replaced.
            replace_file(model / "config.pbtxt", config.replace("max_batch_size: 0", "max_batch_size: oops"))

            def reload_failed() -> bool:
                rows = [r for r in client.get_model_repository_index() if r["name"] == MODEL]
                return any("reload failed" in r.get("reason", "") and r.get("state") == "READY" for r in rows)

            eventually(reload_failed, "the index shows the failed reload beside the serving version")
            before = load.served_by(1)
            eventually(lambda: sum(load.answers.values()) > before + 100, "the old config keeps serving")

            # The repository vanishes (a bucket deleted, a volume gone): what
            # serves keeps serving.
            os.rename(repo, tmp_path / "gone")
            time.sleep(3 * POLL_SECS)
            before = sum(load.answers.values())
            eventually(lambda: sum(load.answers.values()) > before + 100, "serving without a repository")
            assert client.is_model_ready(MODEL)

            # Back, and repaired: picked up again.
            os.rename(tmp_path / "gone", repo)
            replace_file(model / "config.pbtxt", config)
            eventually(lambda: client.get_model_config(MODEL)["instance_group"][0]["count"] == 1,
                       "the repaired config serves")

        assert load.failures == [], load.failures[:5]
        assert set(load.answers) == {1, 2}, load.answers
        assert sum(load.answers.values()) > 1000, load.answers

        # The model removed from the repository: unloaded, and said so.
        shutil.rmtree(model)
        eventually(lambda: not client.is_model_ready(MODEL), "the removed model is unloaded")

        def unloaded() -> bool:
            # UNLOADING until its last requests finished and its instance stopped.
            rows = [r for r in client.get_model_repository_index() if r["name"] == MODEL]
            return bool(rows) and all(
                r.get("state") == "UNAVAILABLE" and r.get("reason") == "removed from the model repository" for r in rows
            )

        eventually(unloaded, "the index says the removed model is unloaded, and why")
        log = server.output()
        assert "poll: reloaded" in log and "cannot be read" in log, log[-2000:]
    finally:
        server.stop_and_check()
