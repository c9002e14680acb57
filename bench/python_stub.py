"""The Python stub's own cost per execute, without the server: the stub of
this checkout runs add_sub (examples/python_models) against the fake host of
python/stub/tests (a Python stand-in for the server's side of the protocol),
one request per execute, one execute at a time, and its CPU is read from
/proc around the measured executes. A benchmark, not a test.

    .venv/bin/python bench/python_stub.py [EXECUTES]

Prints the stub's user and system CPU per execute and the wall time of a
round trip (the fake host's own Python time included, so only the CPU
figures say anything about the stub).
"""

import os
import pathlib
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python" / "stub" / "tests"))
import test_stub  # noqa: E402  (the fake host)

CONFIG = {
    "name": "add_sub",
    "max_batch_size": 0,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")],
}


def cpu_seconds(pid):
    """(user, system) seconds of a process, from /proc."""
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main():
    executes = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    source = (REPO / "examples" / "python_models" / "add_sub" / "1" / "model.py").read_text()
    host = test_stub.FakeHost(pathlib.Path(tempfile.mkdtemp()), source, config=CONFIG)
    try:
        host.start()
        a = np.arange(4, dtype=np.float32)
        b = np.ones(4, dtype=np.float32)

        def one():
            host.hhead = 0  # the stub has freed the last execute's inputs
            host.execute([{"inputs": [host.put("INPUT0", a), host.put("INPUT1", b)]}])
            outputs = host.expect("executed")["responses"][0]["outputs"]
            got = [host.get(d) for d in outputs]
            assert np.array_equal(got[0], a + b) and np.array_equal(got[1], a - b)

        for _ in range(500):
            one()
        user0, sys0 = cpu_seconds(host.proc.pid)
        started = time.perf_counter()
        for _ in range(executes):
            one()
        wall = time.perf_counter() - started
        user1, sys1 = cpu_seconds(host.proc.pid)
    finally:
        host.close()
    per = 1e6 / executes
    print(
        "stub CPU per execute: user %.1f us, system %.1f us; round trip %.1f us (%d executes)"
        % ((user1 - user0) * per, (sys1 - sys0) * per, wall * per, executes)
    )


if __name__ == "__main__":
    main()
