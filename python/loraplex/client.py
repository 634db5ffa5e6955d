"""A typed client of loraplex-server's gRPC API (proto/loraplex/v1).

    import loraplex
    client = loraplex.Client("127.0.0.1:50051")
    dataset = client.upload_dataset("train.jsonl", name="demo")
    job = client.create_job(dataset, optimizer={"family": "muon", "lr": 2e-2},
                            lora={"rank": 16}, training={"max_steps": 200})
    job = client.watch(job)                 # a tqdm bar until it finishes
    client.events_frame(job)                # its metrics, a pandas frame
    client.export_adapter(job, "my-adapter/")

Methods answer the API's protobuf messages (typed: the package ships their
.pyi stubs); configs are given as dicts in the proto's JSON form, with
optimizer families, scalar optimizers and job statuses also by their short
names ("muon", "lion", "soap", "running"). Errors are loraplex.LoraplexError
with the gRPC code and the server's message, which names the field that is
wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

import grpc
from google.protobuf import json_format

from loraplex.v1 import (adapters_pb2, adapters_pb2_grpc, configs_pb2,
                         datasets_pb2, datasets_pb2_grpc, jobs_pb2,
                         jobs_pb2_grpc, sampling_pb2, sampling_pb2_grpc,
                         server_pb2, server_pb2_grpc, sessions_pb2,
                         sessions_pb2_grpc)

_FINISHED = {
    jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_FAILED,
    jobs_pb2.JOB_STATUS_CANCELLED, jobs_pb2.JOB_STATUS_PAUSED
}


class LoraplexError(Exception):
    """A call the server refused or that failed: `code` is the gRPC status
    code, `message` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _name(kind: str, value: Any) -> str:
    """A resource name ("jobs/ID") from a name, a bare id or a message."""
    if hasattr(value, "name") and isinstance(value.name, str):
        value = value.name
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a {kind[:-1]} (id, name or message), "
                         f"got {value!r}")
    return value if value.startswith(kind + "/") else f"{kind}/{value}"


# OptimizerConfig's enum fields also taken by their short names ("lion").
_SHORT_ENUMS = (("family", "OPTIMIZER_FAMILY_"),
                ("scalar_optimizer", "SCALAR_OPTIMIZER_"),
                ("scalarOptimizer", "SCALAR_OPTIMIZER_"))


def _message(cls, value: Mapping[str, Any] | None, field: str):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    value = dict(value)
    if cls is configs_pb2.OptimizerConfig:
        for key, prefix in _SHORT_ENUMS:
            if isinstance(value.get(key), str):
                name = value[key].upper()
                if not name.startswith(prefix):
                    value[key] = prefix + name
    try:
        return json_format.ParseDict(value, cls())
    except json_format.ParseError as error:
        raise ValueError(f"{field}: {error}") from None


def _status(value: str | int) -> int:
    if isinstance(value, int):
        return value
    name = value.upper()
    if not name.startswith("JOB_STATUS_"):
        name = "JOB_STATUS_" + name
    return jobs_pb2.JobStatus.Value(name)


class Client:
    """One connection to loraplex-server. `token` is a --tokens-file token
    (sent as "authorization: Bearer"); `tls_ca` a PEM file for TLS."""

    def __init__(self, address: str = "127.0.0.1:50051", *,
                 token: str | None = None, tls_ca: str | None = None,
                 timeout: float = 60.0):
        if tls_ca is not None:
            with open(tls_ca, "rb") as f:
                credentials = grpc.ssl_channel_credentials(f.read())
            self._channel = grpc.secure_channel(address, credentials)
        else:
            self._channel = grpc.insecure_channel(address)
        self._metadata = (("authorization", f"Bearer {token}"),) if token \
            else ()
        self._timeout = timeout
        self.datasets = datasets_pb2_grpc.DatasetServiceStub(self._channel)
        self.jobs = jobs_pb2_grpc.JobServiceStub(self._channel)
        self.adapters = adapters_pb2_grpc.AdapterServiceStub(self._channel)
        self.sampling = sampling_pb2_grpc.SamplingServiceStub(self._channel)
        self.sessions = sessions_pb2_grpc.TrainingSessionServiceStub(
            self._channel)
        self.server = server_pb2_grpc.ServerServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: float | None = None):
        try:
            return method(request, metadata=self._metadata,
                          timeout=timeout or self._timeout)
        except grpc.RpcError as error:
            raise LoraplexError(error.code(), error.details()) from None

    def _stream(self, method, request) -> Iterator[Any]:
        try:
            yield from method(request, metadata=self._metadata)
        except grpc.RpcError as error:
            raise LoraplexError(error.code(), error.details()) from None

    # Server.
    def info(self) -> server_pb2.ServerInfo:
        return self._call(self.server.GetServerInfo,
                          server_pb2.GetServerInfoRequest())

    # Datasets.
    def upload_dataset(self, path: str | os.PathLike, *, name: str = "",
                       chunk_bytes: int = 1 << 20,
                       chat_template_kwargs: Mapping[str, Any] | None = None,
                       turns: str = "") -> datasets_pb2.Dataset:
        """Uploads a JSONL file; the server validates every line (an error
        names the line). chat_template_kwargs (template variables, e.g.
        {"enable_thinking": False}) and turns ("all" or "last") apply to
        every chat line; a line's own chat_template_kwargs merge over them
        key by key, its own turns replace them."""

        # Size and digest let the server refuse a stream cut short.
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(chunk_bytes):
                digest.update(chunk)
        total = os.path.getsize(path)

        def parts() -> Iterable[datasets_pb2.UploadDatasetRequest]:
            yield datasets_pb2.UploadDatasetRequest(
                header=datasets_pb2.UploadDatasetHeader(
                    display_name=name, total_bytes=total,
                    sha256=digest.hexdigest(),
                    chat_template_kwargs=(
                        json.dumps(dict(chat_template_kwargs))
                        if chat_template_kwargs is not None else ""),
                    turns=turns))
            with open(path, "rb") as f:
                while chunk := f.read(chunk_bytes):
                    yield datasets_pb2.UploadDatasetRequest(chunk=chunk)

        return self._call(self.datasets.UploadDataset, parts(), timeout=3600)

    def get_dataset(self, dataset) -> datasets_pb2.Dataset:
        return self._call(self.datasets.GetDataset,
                          datasets_pb2.GetDatasetRequest(
                              name=_name("datasets", dataset)))

    # Jobs.
    def _job_request(self, dataset, *, name: str, validation_dataset,
                     initial_adapter, lora, optimizer, schedule,
                     training) -> jobs_pb2.CreateJobRequest:
        return jobs_pb2.CreateJobRequest(
            display_name=name,
            training_dataset=_name("datasets", dataset) if dataset else "",
            validation_dataset=(_name("datasets", validation_dataset)
                                if validation_dataset else ""),
            initial_adapter=(_name("adapters", initial_adapter)
                             if initial_adapter else ""),
            lora=_message(configs_pb2.LoraConfig, lora, "lora"),
            optimizer=_message(configs_pb2.OptimizerConfig, optimizer,
                               "optimizer"),
            schedule=_message(configs_pb2.LrSchedule, schedule, "schedule"),
            training=_message(configs_pb2.TrainingConfig, training,
                              "training"))

    def create_job(self, dataset, *, name: str = "", validation_dataset=None,
                   initial_adapter=None, lora: Mapping | None = None,
                   optimizer: Mapping | None = None,
                   schedule: Mapping | None = None,
                   training: Mapping | None = None) -> jobs_pb2.Job:
        """A fine-tuning job; unset fields take the server's defaults."""
        return self._call(self.jobs.CreateJob, self._job_request(
            dataset, name=name, validation_dataset=validation_dataset,
            initial_adapter=initial_adapter, lora=lora, optimizer=optimizer,
            schedule=schedule, training=training))

    def get_job(self, job) -> jobs_pb2.Job:
        return self._call(self.jobs.GetJob,
                          jobs_pb2.GetJobRequest(name=_name("jobs", job)))

    def list_jobs(self, statuses: Sequence[str | int] = ()) -> list:
        jobs, token = [], ""
        while True:
            page = self._call(self.jobs.ListJobs, jobs_pb2.ListJobsRequest(
                statuses=[_status(s) for s in statuses], page_token=token))
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    def cancel_job(self, job) -> jobs_pb2.Job:
        return self._call(self.jobs.CancelJob,
                          jobs_pb2.CancelJobRequest(name=_name("jobs", job)))

    def delete_job(self, job) -> None:
        """Deletes a finished job (record, events, checkpoints); its
        trained adapter stays."""
        self._call(self.jobs.DeleteJob,
                   jobs_pb2.DeleteJobRequest(name=_name("jobs", job)))

    def pause_job(self, job) -> jobs_pb2.Job:
        return self._call(self.jobs.PauseJob,
                          jobs_pb2.PauseJobRequest(name=_name("jobs", job)),
                          timeout=600)

    def resume_job(self, job) -> jobs_pb2.Job:
        return self._call(self.jobs.ResumeJob,
                          jobs_pb2.ResumeJobRequest(name=_name("jobs", job)))

    def watch(self, job, *, progress: bool = True) -> jobs_pb2.Job:
        """Follows the job until it finishes (or pauses), showing a tqdm bar
        of its steps with the loss; answers the job as it ended. A broken
        stream is resumed from the last event seen."""
        from tqdm.auto import tqdm

        name = _name("jobs", job)
        current = self.get_job(name)
        bar = tqdm(total=current.total_steps or None, desc=name,
                   disable=not progress, unit="step")
        after = 0
        try:
            while current.status not in _FINISHED:
                try:
                    for event in self._stream(
                            self.jobs.WatchJob,
                            jobs_pb2.WatchJobRequest(name=name,
                                                     after_sequence=after)):
                        after = event.sequence
                        if event.HasField("metrics"):
                            m = event.metrics
                            bar.update(m.step - bar.n)
                            bar.set_postfix(loss=f"{m.loss:.4f}",
                                            lr=f"{m.lr:.3g}")
                        elif event.status_change.status in _FINISHED:
                            break
                except LoraplexError as error:
                    if error.code != grpc.StatusCode.UNAVAILABLE:
                        raise
                current = self.get_job(name)
                if current.total_steps and bar.total != current.total_steps:
                    bar.total = current.total_steps
            bar.update(current.metrics.step - bar.n)
        finally:
            bar.close()
        return current

    def events(self, job) -> list[dict]:
        """The job's events, oldest first, as dicts: `sequence`, `time` (a
        datetime), `status` and `message` for status changes, and `step`,
        `loss`, `lr`, `grad_norm`, `tokens_per_second`, `tokens`,
        `skipped_steps`, `validation_loss` for metrics."""
        name = _name("jobs", job)
        rows, token = [], ""
        while True:
            page = self._call(self.jobs.ListJobEvents,
                              jobs_pb2.ListJobEventsRequest(
                                  name=name, page_size=1000,
                                  page_token=token))
            for event in page.events:
                row: dict[str, Any] = {"sequence": event.sequence,
                                       "time": event.time.ToDatetime()}
                if event.HasField("metrics"):
                    m = event.metrics
                    row.update(step=m.step, loss=m.loss, lr=m.lr,
                               grad_norm=m.grad_norm,
                               tokens_per_second=m.tokens_per_second,
                               tokens=m.tokens, skipped_steps=m.skipped_steps,
                               validation_loss=(m.validation_loss
                                                if m.HasField(
                                                    "validation_loss")
                                                else None))
                else:
                    change = event.status_change
                    row.update(status=jobs_pb2.JobStatus.Name(
                        change.status).removeprefix("JOB_STATUS_").lower(),
                               message=change.message)
                rows.append(row)
            token = page.next_page_token
            if not token:
                return rows

    def events_frame(self, job):
        """events() as a pandas DataFrame (pip install 'loraplex[pandas]')."""
        import pandas
        return pandas.DataFrame(self.events(job))

    # Adapters.
    def attach_adapter(self, adapter, dataset=None, *, name: str = "",
                       **job: Any) -> adapters_pb2.AttachAdapterResponse:
        """Trains an adapter further (or evaluates it with
        training={"evaluate": ...}): a stored adapter's name, or a local PEFT
        directory, which is uploaded first. `job` takes create_job's
        keywords."""
        request = adapters_pb2.AttachAdapterRequest(
            display_name=name,
            job=self._job_request(dataset, name=job.pop("job_name", ""),
                                  validation_dataset=job.pop(
                                      "validation_dataset", None),
                                  initial_adapter=None,
                                  lora=None, optimizer=job.pop(
                                      "optimizer", None),
                                  schedule=job.pop("schedule", None),
                                  training=job.pop("training", None)))
        if job:
            raise TypeError(f"unexpected arguments: {sorted(job)}")
        if isinstance(adapter, (str, os.PathLike)) and os.path.isdir(adapter):
            with open(os.path.join(adapter, "adapter_config.json")) as f:
                config = f.read()
            with open(os.path.join(adapter, "adapter_model.safetensors"),
                      "rb") as f:
                weights = f.read()
            request.files.adapter_config_json = config
            request.files.adapter_model_safetensors = weights
        else:
            request.adapter = _name("adapters", adapter)
        return self._call(self.adapters.AttachAdapter, request, timeout=600)

    def retire_adapter(self, job) -> adapters_pb2.RetireAdapterResponse:
        """Stops a running job and frees its slot."""
        return self._call(self.adapters.RetireAdapter,
                          adapters_pb2.RetireAdapterRequest(
                              job=_name("jobs", job)))

    def delete_adapter(self, adapter) -> None:
        """Deletes a stored adapter (refused while an unfinished job starts
        from it)."""
        self._call(self.adapters.DeleteAdapter,
                   adapters_pb2.DeleteAdapterRequest(
                       name=_name("adapters", adapter)))

    def export_adapter(self, source, out_dir: str | os.PathLike) -> list:
        """Writes the PEFT files (adapter_config.json,
        adapter_model.safetensors) of a job ("jobs/ID": its current or
        trained adapter), a stored adapter ("adapters/ID") or a checkpoint
        ("jobs/ID/checkpoints/STEP") into `out_dir`; answers their paths."""
        name = _name("jobs", source) if not isinstance(source, str) else source
        request = adapters_pb2.ExportAdapterRequest()
        if "/checkpoints/" in name:
            request.checkpoint = name
        elif name.startswith("adapters/"):
            request.adapter = name
        else:
            request.job = _name("jobs", name)
        os.makedirs(out_dir, exist_ok=True)
        files: dict[str, Any] = {}
        try:
            for chunk in self._stream(self.adapters.ExportAdapter, request):
                if chunk.file_name and chunk.file_name not in files:
                    if os.path.basename(chunk.file_name) != chunk.file_name:
                        raise LoraplexError(grpc.StatusCode.INTERNAL,
                                            f"bad file name {chunk.file_name}")
                    files[chunk.file_name] = open(
                        os.path.join(out_dir, chunk.file_name + ".part"), "wb")
                files[chunk.file_name or next(reversed(files))].write(
                    chunk.data)
        finally:
            for f in files.values():
                f.close()
        paths = []
        for file_name in files:
            path = os.path.join(out_dir, file_name)
            os.replace(path + ".part", path)
            paths.append(path)
        return paths

    def list_slots(self) -> adapters_pb2.ListSlotsResponse:
        return self._call(self.adapters.ListSlots,
                          adapters_pb2.ListSlotsRequest())

    # Sampling.
    def sample(self, prompt: str | Sequence[int] | None = None, *,
               messages: Sequence[Mapping[str, str]] | None = None,
               job=None, adapter=None, checkpoint: str | None = None,
               **params: Any) -> sampling_pb2.SampleResponse:
        """Samples from a job, an adapter, a checkpoint or the base model:
        `prompt` is text or token ids, `messages` chat messages. `params`
        are SampleRequest's fields (n, max_tokens, temperature, top_p,
        top_k, seed, stop, stop_token_ids, top_logprobs, prompt_logprobs)."""
        request = sampling_pb2.SampleRequest(**params)
        if messages is not None:
            request.messages.messages.extend(
                sampling_pb2.ChatMessage(role=m["role"], content=m["content"])
                for m in messages)
        elif isinstance(prompt, str):
            request.text = prompt
        elif prompt is not None:
            request.tokens.ids.extend(prompt)
        else:
            raise ValueError("give a prompt (text or token ids) or messages")
        if job is not None:
            request.job = _name("jobs", job)
        elif adapter is not None:
            request.adapter = _name("adapters", adapter)
        elif checkpoint is not None:
            request.checkpoint = checkpoint
        return self._call(self.sampling.Sample, request, timeout=600)

    # Training sessions.
    def create_session(self, *, lora: Mapping | None = None,
                       optimizer: Mapping | None = None, seed: int = 0,
                       name: str = "") -> sessions_pb2.Session:
        return self._call(self.sessions.CreateSession,
                          sessions_pb2.CreateSessionRequest(
                              lora=_message(configs_pb2.LoraConfig, lora,
                                            "lora"),
                              optimizer=_message(configs_pb2.OptimizerConfig,
                                                 optimizer, "optimizer"),
                              seed=seed, display_name=name))

    def forward_backward(self, session, seq_id: int,
                         data: Sequence[Mapping[str, Any]],
                         loss_fn: str = "cross_entropy", *,
                         loss_fn_config: Mapping[str, float] | None = None,
                         forward_only: bool = False
                         ) -> sessions_pb2.SessionResult:
        """Operation `seq_id` of the session: `data` are datums as dicts
        (input_ids, target_tokens, weights or logprobs and advantages)."""
        return self._call(self.sessions.ForwardBackward,
                          sessions_pb2.ForwardBackwardRequest(
                              session=_name("sessions", session),
                              seq_id=seq_id,
                              data=[sessions_pb2.Datum(**d) for d in data],
                              loss_fn=loss_fn,
                              loss_fn_config=dict(loss_fn_config or {}),
                              forward_only=forward_only), timeout=600)

    def optim_step(self, session, seq_id: int,
                   **params: Any) -> sessions_pb2.SessionResult:
        """Steps on the gradients summed so far; `params`: lr, beta1,
        beta2, eps, weight_decay, momentum, lion_beta1, lion_beta2,
        soap_beta1, soap_beta2, shampoo_beta, precondition_frequency,
        power_iter_steps, use_eigh, max_update_rms, max_precond_dim (only
        the session's), grad_clip_norm."""
        return self._call(self.sessions.OptimStep,
                          sessions_pb2.OptimStepRequest(
                              session=_name("sessions", session),
                              seq_id=seq_id, **params), timeout=600)

    def save_weights_for_sampler(self, session, seq_id: int, *,
                                 name: str = "") -> sessions_pb2.SessionResult:
        """Stores the session's weights as an adapter that sample() and
        export_adapter() take (result.saved_weights.adapter)."""
        return self._call(self.sessions.SaveWeightsForSampler,
                          sessions_pb2.SaveWeightsForSamplerRequest(
                              session=_name("sessions", session),
                              seq_id=seq_id, display_name=name), timeout=600)

    def close_session(self, session) -> sessions_pb2.Session:
        return self._call(self.sessions.CloseSession,
                          sessions_pb2.CloseSessionRequest(
                              name=_name("sessions", session)))
