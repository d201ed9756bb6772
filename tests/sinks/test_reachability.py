"""Reachability: GET /health with a short timeout, cached with back-off; bounded MLflow HTTP."""

from __future__ import annotations

import os

import pytest

from neuron_mlflow.sinks import reachability
from neuron_mlflow.sinks.reachability import bounded_http, check_reachable
from tests.conftest import free_port
from tests.sinks.stubs import hanging_server, unavailable_server


@pytest.fixture(autouse=True)
def _fresh_cache():
    reachability.forget()
    yield
    reachability.forget()


def test_a_real_mlflow_server_is_reachable(mlflow_server) -> None:
    check_reachable(mlflow_server)


def test_nothing_listening_is_unreachable() -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    expected = f"cannot connect to the MLflow tracking server at {uri}"
    with pytest.raises(ConnectionError, match=expected):
        check_reachable(uri)


def test_a_server_that_never_answers_is_unreachable_after_the_short_timeout() -> None:
    with hanging_server() as stub, pytest.raises(ConnectionError, match="no answer to GET /health"):
        check_reachable(stub.uri, timeout_s=0.5)


def test_a_proxy_answering_503_is_unreachable_though_it_accepts_connections() -> None:
    with unavailable_server() as stub:
        with pytest.raises(ConnectionError, match="HTTP 503"):
            check_reachable(stub.uri)
        assert stub.connections == 1


def test_a_failed_check_is_cached_with_back_off_then_checked_again() -> None:
    with unavailable_server() as stub:
        with pytest.raises(ConnectionError):
            check_reachable(stub.uri)
        with pytest.raises(ConnectionError, match="checked recently"):
            check_reachable(stub.uri)
        assert stub.connections == 1, "the second call answered from the cache"
        with pytest.raises(ConnectionError, match="HTTP 503"):
            check_reachable(stub.uri, cached=False)
        assert stub.connections == 2
        state = reachability._cache[stub.uri]
        assert state.backoff_s == 2 * reachability.FIRST_BACKOFF_S, "the back-off doubles"


def test_sqlite_and_file_stores_are_checked_by_their_own_means(tmp_path) -> None:
    check_reachable(f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(ConnectionError, match="does not exist"):
        check_reachable(f"sqlite:///{tmp_path}/missing/folder/mlflow.db")
    check_reachable(f"file://{tmp_path}/mlruns")


def test_bounded_http_caps_mlflow_retries_and_keeps_a_lower_user_value(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with bounded_http():
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_bounded_http_caps_a_higher_user_value_and_gives_it_back(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    with bounded_http():
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == str(
            reachability.HTTP_BOUNDS["MLFLOW_HTTP_REQUEST_TIMEOUT"]
        )
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "120"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "7"
