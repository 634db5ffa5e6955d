"""The Python package against a real loraplex-server on loopback.

  python client_test.py BUILD_BIN_DIR

Uploads a dataset, trains a job to its end watching it, reads its events
(dicts and a pandas frame), exports its adapter and attaches it again,
samples from it, pauses/resumes/cancels a second job, and runs a training
session's loop; checks a bad request's error names its field.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import grpc
import loraplex


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    bin_dir = sys.argv[1]
    work = tempfile.mkdtemp(prefix="loraplex-python-")
    ready = os.path.join(work, "ready")
    port = free_port()
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen(
        [os.path.join(bin_dir, "loraplex-server"), "--state-dir",
         os.path.join(work, "state"), "--listen", f"127.0.0.1:{port}",
         "--threads", "1", "--slots", "3", "--ready-file", ready],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not os.path.exists(ready):
            assert server.poll() is None and time.time() < deadline, \
                open(os.path.join(work, "server.log")).read()
            time.sleep(0.05)
        run(work, f"127.0.0.1:{port}")
        print("OK")
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert server.returncode == 0, open(os.path.join(work, "server.log")).read()


def run(work, address):
    data = os.path.join(work, "train.jsonl")
    with open(data, "w") as f:
        for i in range(32):
            f.write(json.dumps({"text": f"the quick brown fox {i % 4} " * 4})
                    + "\n")
    with loraplex.Client(address) as client:
        info = client.info()
        assert info.base_model.name, info

        dataset = client.upload_dataset(data, name="foxes")
        assert dataset.name.startswith("datasets/"), dataset
        assert dataset.num_examples == 32, dataset

        job = client.create_job(dataset, name="fox", lora={"rank": 4},
                                optimizer={"family": "muon", "lr": 2e-2},
                                training={"max_steps": 12, "seq_len": 32,
                                          "batch_size": 2})
        job = client.watch(job, progress=True)
        assert job.status == loraplex.v1.jobs_pb2.JOB_STATUS_SUCCEEDED, job
        assert job.metrics.step == 12, job

        events = client.events(job)
        steps = [e for e in events if "step" in e]
        statuses = [e["status"] for e in events if "status" in e]
        assert [e["step"] for e in steps] == list(range(1, 13)), steps
        assert statuses[-1] == "succeeded", statuses
        assert steps[-1]["loss"] < steps[0]["loss"], steps
        frame = client.events_frame(job)
        assert list(frame.dropna(subset=["step"])["step"]) == \
            list(range(1, 13))

        out = os.path.join(work, "adapter")
        paths = client.export_adapter(job, out)
        assert sorted(os.path.basename(p) for p in paths) == \
            ["adapter_config.json", "adapter_model.safetensors"], paths
        config = json.load(open(os.path.join(out, "adapter_config.json")))
        assert config["r"] == 4, config

        sample = client.sample("the quick", job=job, max_tokens=8,
                               temperature=0.0)
        assert len(sample.samples[0].tokens) >= 1, sample

        # The exported directory trains further, uploaded by attach.
        attached = client.attach_adapter(out, dataset,
                                         training={"max_steps": 2,
                                                   "seq_len": 32})
        again = client.watch(attached.job, progress=False)
        assert again.status == loraplex.v1.jobs_pb2.JOB_STATUS_SUCCEEDED, \
            again

        # Pause, resume and cancel a long job.
        long_job = client.create_job(dataset, training={"max_steps": 100000,
                                                        "seq_len": 32})
        deadline = time.time() + 60
        while client.get_job(long_job).status != \
                loraplex.v1.jobs_pb2.JOB_STATUS_RUNNING:
            assert time.time() < deadline
            time.sleep(0.1)
        paused = client.pause_job(long_job)
        assert paused.status == loraplex.v1.jobs_pb2.JOB_STATUS_PAUSED, paused
        client.resume_job(long_job)
        cancelled = client.cancel_job(long_job)
        assert cancelled.status == loraplex.v1.jobs_pb2.JOB_STATUS_CANCELLED
        assert len(client.list_jobs(["cancelled"])) == 1

        # A training session: the loss of a repeated batch falls.
        session = client.create_session(lora={"rank": 4},
                                        optimizer={"family": "adamw"},
                                        seed=5)
        datum = {"input_ids": [5, 17, 33, 9, 41],
                 "target_tokens": [17, 33, 9, 41, 12],
                 "weights": [1.0] * 5}
        losses = []
        seq = 0
        for _ in range(6):
            seq += 1
            result = client.forward_backward(session, seq, [datum])
            losses.append(result.forward_backward.loss)
            seq += 1
            client.optim_step(session, seq, lr=2e-2)
        assert losses[-1] < 0.5 * losses[0], losses
        seq += 1
        saved = client.save_weights_for_sampler(session, seq, name="s")
        assert saved.saved_weights.adapter.startswith("adapters/"), saved
        client.close_session(session)

        # A bad request is a LoraplexError naming the field.
        try:
            client.create_job(dataset, lora={"rank": 0})
        except loraplex.LoraplexError as error:
            assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error
            assert "lora.rank" in error.message, error.message
        else:
            raise AssertionError("rank 0 was accepted")


if __name__ == "__main__":
    main()
