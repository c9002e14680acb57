"""Nereid's Python stub: runs one instance of a Triton `model.py`.

The server starts `python3 nereid_stub.py` with NEREID_STUB_FD and
NEREID_STUB_OUT_FD naming its ends of two Unix stream sockets: the server's
frames come on the first, the stub's go out on the second. The protocol is
docs/python-backend.md, "The stub protocol". The main thread reads the
socket itself, runs the model's execute and answers; see
nereid_stub_shm.Channel for how other threads (decoupled senders, BLS
calls, async_exec) share the sockets.
"""

import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
import traceback

import nereid_stub_shm as rt_mod
import triton_python_backend_utils as pb_utils


# Triton's stub drops the outputs a request did not ask for. The protocol
# says nothing of it, so the stub sends every output and leaves the choice
# to the server; True would drop them here, before they are copied.
PRUNE_UNREQUESTED = False


class StubFailure(Exception):
    """A failure whose message is already clear (no traceback needed)."""


def describe(exc, frames=4):
    """The exception's type and text, and the traceback's last lines."""
    if isinstance(exc, StubFailure):
        return str(exc)
    text = "%s: %s" % (type(exc).__name__, exc)
    tb = traceback.extract_tb(exc.__traceback__)
    # Frames of the stub itself say nothing about the model's fault.
    here = (os.path.abspath(__file__), os.path.abspath(rt_mod.__file__))
    model_frames = [
        f for f in tb if not f.filename.startswith("<frozen") and os.path.abspath(f.filename) not in here
    ]
    lines = []
    for f in model_frames[-frames:]:
        line = '  File "%s", line %s, in %s' % (f.filename, f.lineno, f.name)
        if f.line:
            line += "\n    " + f.line.strip()
        lines.append(line)
    if lines:
        text += "\nTraceback (most recent call last):\n" + "\n".join(lines)
    return text


def error_wire(exc_or_text, code="INTERNAL"):
    message = exc_or_text if isinstance(exc_or_text, str) else describe(exc_or_text)
    return {"message": message, "code": code}


class Execution:
    """One execute: how its requests' senders reach the server."""

    __slots__ = ("rt", "decoupled", "first", "requested", "collected", "final")

    def __init__(self, rt, decoupled, first, requested):
        self.rt = rt
        self.decoupled = decoupled
        self.first = first  # the key of request 0; the others follow
        self.requested = requested  # per request: a set of output names, or None (all)
        n = len(requested)
        self.collected = [None] * n
        self.final = [False] * n

    def forget(self):
        """The server can no longer cancel any of these requests."""
        for key in range(self.first, self.first + len(self.requested)):
            self.rt.live.pop(key, None)

    def sender_send(self, index, response, final):
        if self.decoupled:
            key = self.first + index
            wire = None if response is None else response._to_wire(self.rt, self.requested[index])
            self.rt.channel.send({"op": "response", "request": key, "response": wire, "flags": 1 if final else 0})
            if final:
                self.rt.live.pop(key, None)
            return
        # Not decoupled: the sender may give each request its one response;
        # it goes out in `executed` when execute returns None.
        if response is not None:
            if self.collected[index] is not None:
                raise pb_utils.TritonModelException(
                    "a model that is not decoupled sends exactly one response per request"
                )
            self.collected[index] = response
        if final:
            self.final[index] = True


class Stub:
    def __init__(self, rt):
        self.rt = rt
        self.model = None
        self.decoupled = False
        self.loop = None

    # -- helpers

    def send(self, msg):
        self.rt.channel.send(msg)

    def run(self, result):
        """Runs a coroutine to completion on the stub's own event loop."""
        if result is None or type(result) is list:
            return result  # what execute returns, without inspect's checks
        if inspect.isawaitable(result):
            if self.loop is None:
                import asyncio

                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            return self.loop.run_until_complete(result)
        return result

    def load_class(self, model_file):
        if not model_file or not os.path.isfile(model_file):
            raise StubFailure("the model file %s does not exist" % model_file)
        folder = os.path.dirname(os.path.abspath(model_file))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            spec = importlib.util.spec_from_file_location("model", model_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules["model"] = module
            spec.loader.exec_module(module)
        except SyntaxError as e:
            raise StubFailure(
                "%s cannot be imported: SyntaxError: %s (line %s: %s)"
                % (model_file, e.msg, e.lineno, (e.text or "").strip())
            )
        except BaseException as e:
            raise StubFailure("%s cannot be imported: %s" % (model_file, describe(e)))
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None or not inspect.isclass(cls):
            raise StubFailure("%s defines no class TritonPythonModel" % model_file)
        return cls

    def exit(self, code):
        if self.loop is not None:
            try:
                self.loop.close()
            except Exception:
                pass
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code)

    # -- messages

    def on_init(self, msg):
        try:
            args = msg.get("args") or {}
            try:
                config = json.loads(args.get("model_config") or "{}")
            except ValueError as e:
                raise StubFailure("model_config is not JSON: %s" % e)
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
            self.rt.decoupled = self.decoupled
            shm = msg.get("shm") or {}
            channel = self.rt.channel
            try:
                self.rt.stub_pool = rt_mod.StubPool(
                    shm.get("default_byte_size", 1 << 20),
                    shm.get("growth_byte_size", 1 << 20),
                    shm.get("limit_byte_size", 1 << 30),
                    lambda index, fd: channel.send({"op": "segment", "seg": index}, fd),
                )
            except rt_mod.ShmError as e:
                raise StubFailure(str(e))
            cls = self.load_class(msg.get("model_file"))
            try:
                model = cls()
                init = getattr(model, "initialize", None)
                if init is not None:
                    self.run(init(args))
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt):
                    raise
                raise StubFailure("initialize failed: " + describe(e))
            self.model = model
        except BaseException as e:
            self.send({"op": "failed", "message": describe(e)})
            self.exit(1)
        self.send({"op": "ready"})

    def on_auto_complete(self, msg):
        try:
            cls = self.load_class(msg.get("model_file"))
            config = pb_utils.ModelConfig(msg.get("config") or {})
            fn = getattr(cls, "auto_complete_config", None)
            if fn is not None:
                try:
                    result = self.run(fn(config))
                except BaseException as e:
                    raise StubFailure("auto_complete_config failed: " + describe(e))
                if isinstance(result, pb_utils.ModelConfig):
                    config = result
            out = config.as_dict()
            json.dumps(out)  # a config that cannot travel fails here, clearly
        except BaseException as e:
            self.send({"op": "failed", "message": describe(e)})
            self.exit(1)
        self.send({"op": "config", "config": out})
        self.exit(0)

    def on_finalize(self, msg):
        model = self.model
        fin = getattr(model, "finalize", None) if model is not None else None
        if fin is not None:
            try:
                self.run(fin())
            except BaseException as e:
                rt_mod.eprint("finalize raised:", describe(e))
        self.send({"op": "finalized"})
        self.exit(0)

    def on_execute(self, msg):
        rt = self.rt
        reqs = msg.get("requests") or []
        state = msg.get("_state") or rt_mod.ExecState(msg.get("first") or 0, len(reqs))
        if PRUNE_UNREQUESTED:
            requested = [set(r.get("requested_outputs") or ()) or None for r in reqs]
        else:
            requested = [None] * len(reqs)
        ex = Execution(rt, self.decoupled, state.first, requested)
        rt.current = ex
        try:
            self._execute(ex, state, reqs)
        finally:
            # A decoupled model's requests stay cancellable until their
            # final response (or executed_error, which ends them all).
            if not self.decoupled:
                ex.forget()

    def _execute(self, ex, state, reqs):
        rt = self.rt
        requested = ex.requested
        if self.model is None:
            self._free_inputs(reqs)
            self.executed_error(error_wire("execute before a successful init"))
            return
        try:
            requests = self._requests(ex, state, reqs)
        except BaseException as e:
            self.executed_error(error_wire("bad execute message: %s" % describe(e)))
            return

        try:
            result = self.run(self.model.execute(requests))
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            del requests
            self.executed_error(error_wire(e))
            return

        n = len(requests)
        del requests
        if self.decoupled:
            if result is not None:
                del result
                self.executed_error(
                    error_wire(
                        "execute of a decoupled model must return None (its responses go "
                        "through each request's response sender)"
                    )
                )
                return
            self.send({"op": "executed", "error": None})
            return

        if result is None and n > 0 and all(ex.final):
            result = [
                r
                if r is not None
                else pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("the response sender sent no response")
                )
                for r in ex.collected
            ]
        ex.collected = None
        problem = None
        if result is None:
            problem = (
                "execute returned None for %d request%s; a model that is not decoupled "
                "returns a list of pb_utils.InferenceResponse, one per request" % (n, "" if n == 1 else "s")
            )
        elif not isinstance(result, (list, tuple)):
            problem = (
                "execute returned a %s; it must return a list of pb_utils.InferenceResponse, "
                "one per request" % type(result).__name__
            )
        elif len(result) != n:
            problem = "execute returned %d response%s for %d request%s" % (
                len(result),
                "" if len(result) == 1 else "s",
                n,
                "" if n == 1 else "s",
            )
        else:
            for k, r in enumerate(result):
                if not isinstance(r, pb_utils.InferenceResponse):
                    problem = "execute's response %d is a %s, not a pb_utils.InferenceResponse" % (
                        k,
                        type(r).__name__,
                    )
                    break
        if problem is not None:
            del result
            self.executed_error(error_wire(problem))
            return
        wire = [r._to_wire(rt, requested[k]) for k, r in enumerate(result)]
        del result
        self.send({"op": "executed", "responses": wire, "error": None})

    def _requests(self, ex, state, reqs):
        """The InferenceRequests of an execute. Kept out of on_execute so
        that no local variable there holds an input past execute."""
        rt = self.rt
        requests = []
        for i, r in enumerate(reqs):
            inputs = []
            descs = r.get("inputs") or []
            try:
                for d in descs:
                    inputs.append(pb_utils._tensor_from_wire(rt, d))
            except BaseException:
                for rest in descs[len(inputs) + 1 :]:
                    rt_mod.free_host_block(rt.host_pool, rest)
                self._free_inputs(reqs[i + 1 :])
                raise
            requests.append(pb_utils.InferenceRequest._received(ex, i, state, r, inputs))
        return requests

    def executed_error(self, error):
        # The server ends every request of the execute still open.
        if self.rt.current is not None:
            self.rt.current.forget()
        msg = {"op": "executed", "error": error}
        if not self.decoupled:
            msg["responses"] = []
        self.send(msg)

    def _free_inputs(self, reqs):
        for r in reqs:
            for d in r.get("inputs") or ():
                rt_mod.free_host_block(self.rt.host_pool, d)

    # -- the loop

    def serve(self):
        handlers = {
            "execute": self.on_execute,
            "init": self.on_init,
            "auto_complete": self.on_auto_complete,
            "finalize": self.on_finalize,
        }
        while True:
            msg = self.rt.next_main()
            if msg is None:
                break
            op = msg.get("op")
            try:
                handlers[op](msg)
            except SystemExit:
                raise
            except BaseException as e:
                rt_mod.eprint("handling %r failed:" % op, describe(e))
                if op == "execute":
                    try:
                        self.executed_error(error_wire("the stub failed: " + describe(e)))
                    except BaseException:
                        pass
                elif op in ("init", "auto_complete"):
                    try:
                        self.send({"op": "failed", "message": describe(e)})
                    except BaseException:
                        pass
                    self.exit(1)
        self.exit(0)


def main():
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops us by closing its sockets
    except (ValueError, OSError):
        pass
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:
        pass
    fds = os.environ.get("NEREID_STUB_FD"), os.environ.get("NEREID_STUB_OUT_FD")
    if None in fds:
        print(
            "nereid_stub: NEREID_STUB_FD and NEREID_STUB_OUT_FD are not set; the server starts this program",
            file=sys.stderr,
        )
        sys.exit(2)
    rsock, wsock = (socket.socket(fileno=int(fd)) for fd in fds)
    for sock in (rsock, wsock):
        sock.setblocking(True)
    rt = rt_mod.install(rsock, wsock)
    Stub(rt).serve()


if __name__ == "__main__":
    main()
