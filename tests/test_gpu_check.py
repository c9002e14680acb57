"""scripts/gpu-check.sh --dry-run on a machine without a GPU: the device
check's every step that needs no device passes (KIND_GPU refused with the
reason, KIND_AUTO on the CPU, no GPU metric family, CUDA shared memory
refused), and every step that does is skipped with its reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import helpers

SCRIPT = helpers.REPO_ROOT / "scripts" / "gpu-check.sh"


def test_the_device_check_dry_run_passes_without_a_gpu(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), NEREID_SERVER_BIN=str(helpers.server_binary()))
    run = subprocess.run(
        [str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=420
    )
    log = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() else ""
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{log}"
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["dry_run"] is True
    outcomes = {step["step"]: step for step in report["steps"]}
    for passed in (
        "placement without a GPU",
        "no GPU metric family without a GPU",
        "CUDA shared memory refused without a GPU",
    ):
        assert outcomes[passed]["outcome"] == "pass", outcomes
    reason = outcomes["placement without a GPU"]["torch_mlp"]["reason"]
    assert "instance group 'torch_mlp_0'" in reason and "sees no GPU" in reason, reason
    skipped = [s for s in report["steps"] if s["outcome"] == "skip"]
    assert len(skipped) == 3 and all(s["reason"] for s in skipped), skipped
    # The script stopped the server it started.
    assert "gpu-check/models" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
