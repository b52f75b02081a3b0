"""miles.utils.http_utils: upstream's post/get with its retries, and miles' departures (a 4xx or 500 raised at once
with the server's message, a hang an error naming --rollout-request-timeout), against a transport made here."""

from types import SimpleNamespace

import httpx
import pytest

from miles.utils import http_utils
from miles.utils.async_utils import run
from miles.utils.errors import RolloutEngineError


@pytest.fixture
def answers(monkeypatch):
    """``set(handler)``: every request of the test goes to ``handler(request) -> httpx.Response``; returns the calls."""
    calls = []
    monkeypatch.setattr(http_utils, "RETRY_WAIT_S", 0.0)
    monkeypatch.setattr(http_utils, "_timeout_s", http_utils._timeout_s)  # put back after init_http_client
    monkeypatch.setattr(http_utils, "_max_connections", http_utils._max_connections)

    def use(handler):
        def recorded(request):
            calls.append(request)
            return handler(request)

        monkeypatch.setattr(http_utils, "_client", httpx.AsyncClient(transport=httpx.MockTransport(recorded)))
        return calls

    yield use
    monkeypatch.setattr(http_utils, "_client", None)


def test_a_busy_server_is_retried_until_it_answers(answers):
    statuses = iter([503, 502, 200])
    calls = answers(lambda request: httpx.Response(next(statuses), json={"text": "7"}))
    assert run(http_utils.post("http://router/generate", {"input_ids": [1]})) == {"text": "7"}
    assert len(calls) == 3 and calls[0].read() == b'{"input_ids":[1]}'


def test_a_refused_request_is_raised_at_once_with_the_servers_message(answers):
    calls = answers(lambda request: httpx.Response(400, json={"error": {"message": "repetition_penalty=1.3 ..."}}))
    with pytest.raises(RolloutEngineError, match="HTTP 400.*repetition_penalty"):
        run(http_utils.post("http://router/generate", {}))
    assert len(calls) == 1


def test_an_engine_error_is_not_retried(answers):
    calls = answers(lambda request: httpx.Response(500, json={"error": {"message": "DivergenceError: nan"}}))
    with pytest.raises(RolloutEngineError, match="DivergenceError"):
        run(http_utils.post("http://router/generate", {}))
    assert len(calls) == 1


def test_an_unreachable_router_fails_after_the_retries_naming_its_flags(answers):
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    calls = answers(refuse)
    with pytest.raises(RolloutEngineError, match="--sglang-router-ip"):
        run(http_utils.post("http://router/generate", {}, max_retries=3))
    assert len(calls) == 3


def test_a_hung_server_is_an_error_naming_the_time_out_flag(answers):
    def hang(request):
        raise httpx.ReadTimeout("timed out", request=request)

    calls = answers(hang)
    with pytest.raises(RolloutEngineError, match="--rollout-request-timeout"):
        run(http_utils.post("http://router/generate", {}))
    assert len(calls) == 1


def test_get_and_the_flag_set_the_time_out(answers, monkeypatch):
    answers(lambda request: httpx.Response(200, json={"weight_version": "3"}))
    assert run(http_utils.get("http://router/get_weight_version")) == {"weight_version": "3"}
    http_utils.init_http_client(SimpleNamespace(rollout_request_timeout=2.5, rollout_num_engines=3))
    client = http_utils._http_client()
    assert client.timeout.read == 2.5 and client._transport._pool._max_connections == 3 * http_utils.CONNECTIONS_PER_ENGINE
