"""The one options record and its policy: rank, run and job id, from the config and the
environment, the same for every front end."""

from __future__ import annotations

import pytest

import neuron_mlflow as nm
from neuron_mlflow.engine.options import JOB_ID_ENV, RUN_ID_ENV, Options


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    monkeypatch.delenv(JOB_ID_ENV, raising=False)


def test_a_launcher_s_run_and_job_reach_every_rank_without_a_collective(monkeypatch):
    monkeypatch.setenv(RUN_ID_ENV, "run-from-launcher")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///x.db")
    monkeypatch.setenv(JOB_ID_ENV, "job-7")

    def no_collective(value):
        raise AssertionError("the environment decides: no broadcast")

    for rank in (0, 1):
        options = Options.resolve(
            nm.ProfilerConfig(), rank=rank, world_size=2, broadcast=no_collective
        )
        assert (options.run_id, options.job_id) == ("run-from-launcher", "job-7")
        assert options.tracking_uri == "sqlite:///x.db"
        assert options.upload  # every rank knows the run
        assert options.traces_only == (rank == 1)


def test_rank_zero_s_run_and_job_are_broadcast_to_the_other_ranks():
    sent = []

    def broadcast_from_rank0(value):  # what rank 0 sent, as a framework's broadcast returns
        return sent[len(sent) - 1] if value is None else (sent.append(value) or value)

    zero = Options.resolve(
        nm.ProfilerConfig(), rank=0, world_size=2, run=("uri", "r0"),
        broadcast=broadcast_from_rank0,
    )  # fmt: skip
    # rank 1 receives, call by call, what rank 0 sent (job id, then the run)
    received = iter(list(sent))
    one = Options.resolve(
        nm.ProfilerConfig(), rank=1, world_size=2, broadcast=lambda _: next(received)
    )
    assert (zero.run_id, one.run_id) == ("r0", "r0")
    assert zero.job_id == one.job_id and zero.job_id
    assert one.tracking_uri == "uri"


def test_capturing_ranks_and_the_decorator_s_defaults():
    config = nm.ProfilerConfig()
    options = Options.resolve(config, ranks=frozenset({0}), rank=1, world_size=2)
    assert not options.captures and options.run_id is None and not options.upload
    plain = Options(config)  # the decorator: rank read when a window opens
    assert plain.captures and plain.upload and not plain.traces_only and not plain.attached
