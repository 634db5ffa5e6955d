"""Starts and stops a real loraplex-server for the Tinker SDK tests.

The server listens on loopback only (gRPC and the HTTP listener), on free
ports, with its state in a fresh directory; its log is kept next to it and
printed when it does not start or does not exit cleanly.
"""

import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tiny_model(bin_dir, work):
    """The built-in tiny model (byte tokenizer), written by
    loraplex-make-model. Returns its directory."""
    model = os.path.join(work, "model")
    subprocess.run([os.path.join(bin_dir, "loraplex-make-model"), "--preset",
                    "tiny", "--seed", "7", "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    return model


class Server:
    """A running loraplex-server; `base_url` is its Tinker API root and
    `grpc_address` its gRPC listener. `env`: its environment (torchrun's
    variables for rank 0 of a data-parallel run)."""

    def __init__(self, bin_dir, work, model, model_name, slots=4, extra=(),
                 env=None):
        self.work = work
        self.log_path = os.path.join(work, "server.log")
        ready = os.path.join(work, "ready")
        grpc_port, http_port = free_port(), free_port()
        self.base_url = f"http://127.0.0.1:{http_port}"
        self.grpc_address = f"127.0.0.1:{grpc_port}"
        log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [os.path.join(bin_dir, "loraplex-server"), "--model", model,
             "--model-name", model_name, "--state-dir",
             os.path.join(work, "state"), "--listen", self.grpc_address,
             "--http-listen", f"127.0.0.1:{http_port}", "--threads", "1",
             "--slots", str(slots), "--ready-file", ready, "--log-level",
             "debug", *extra],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while not os.path.exists(ready):
            if self.process.poll() is not None or time.time() > deadline:
                log.flush()
                self.process.kill()
                sys.exit("loraplex-server did not start:\n" + self.log())
            time.sleep(0.05)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        """SIGTERM, then waits; a server that does not exit with 0 (or by
        the signal) fails the test with its log."""
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.returncode not in (0, -15):
            print(self.log())
            sys.exit(f"loraplex-server exited with {self.process.returncode}")
