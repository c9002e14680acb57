"""Does what ACTION says, to show that nothing a model does harms the
server: "pid" answers the stub's process id; "raise" raises; "exit"
calls os._exit; "segfault" reads address 0; "sleep" sleeps a minute;
"nap:SECONDS:PATH" creates the file PATH (the test's sign that the request
is executing) and sleeps SECONDS; "peek:SECONDS:PATH" naps the same way,
then answers 1 if the server's next frame is already waiting in the stub's
socket, else 0; "big" answers 64 MiB."""

import ctypes
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            if action == "raise":
                raise ValueError("the model was asked to raise")
            if action == "exit":
                os._exit(3)
            if action == "segfault":
                ctypes.string_at(0)
            if action == "sleep":
                time.sleep(60)
            if action.startswith(("nap:", "peek:")):
                _, seconds, path = action.split(":", 2)
                open(path, "w").close()
                time.sleep(float(seconds))
            if action.startswith("peek:"):
                import nereid_stub_shm  # the stub's own runtime: a test's look inside

                waiting = nereid_stub_shm.RUNTIME.channel._readable_now()
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PID", np.array([int(waiting)], dtype=np.int64))]))
                continue
            if action == "big":
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PID", np.zeros(8 << 20, dtype=np.int64))]))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))]))
        return responses
