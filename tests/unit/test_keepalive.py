"""The keepalive options every channel and server gets (holdfast.common.keepalive)."""

from __future__ import annotations

import pytest

from holdfast.common import keepalive, serving


def test_the_interval_is_the_variable_else_the_default_and_a_wrong_one_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(keepalive.ENV, raising=False)
    assert keepalive.seconds() == keepalive.DEFAULT_SECONDS == 20
    monkeypatch.setenv(keepalive.ENV, "7")
    assert keepalive.seconds() == 7
    for wrong in ("0", "3601", "-5", "1.5", "²", "soon"):
        monkeypatch.setenv(keepalive.ENV, wrong)
        with pytest.raises(ValueError, match=keepalive.ENV):
            keepalive.seconds()


def test_a_server_pings_and_accepts_pings_down_to_half_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keepalive.ENV, "20")
    server = dict(keepalive.server_options())
    client = dict(keepalive.channel_options())
    assert client["grpc.keepalive_time_ms"] == server["grpc.keepalive_time_ms"] == 20_000
    assert server["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    # The ack's wait: keepalive_timeout_ms and the ping timeout gRPC 1.85 actually applies.
    assert client["grpc.keepalive_timeout_ms"] == client["grpc.http2.ping_timeout_ms"] == 10_000
    assert client["grpc.keepalive_permit_without_calls"] == 0
    assert client["grpc.http2.max_pings_without_data"] == 0


def test_etcds_channel_never_pings_closer_than_its_default_policy_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keepalive.ENV, "1")
    etcd = dict(keepalive.channel_options(keepalive.ETCD_LOWEST_SECONDS))
    assert etcd["grpc.keepalive_time_ms"] == 10_000 > 5_000  # etcd's --grpc-keepalive-min-time default
    assert dict(keepalive.channel_options())["grpc.keepalive_time_ms"] == 1_000
    assert dict(keepalive.channel_options())["grpc.keepalive_timeout_ms"] == 1_000


def test_every_server_connection_has_a_maximum_age_no_longer_than_the_default_session_certificate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serving.MAX_AGE_ENV, raising=False)
    monkeypatch.delenv(serving.MAX_AGE_GRACE_ENV, raising=False)
    options = dict(serving.connection_age_options())
    assert options == {"grpc.max_connection_age_ms": 3_600_000, "grpc.max_connection_age_grace_ms": 30_000}
    monkeypatch.setenv(serving.MAX_AGE_ENV, "5")
    assert dict(serving.connection_age_options())["grpc.max_connection_age_ms"] == 5000
    monkeypatch.setenv(serving.MAX_AGE_GRACE_ENV, "0")
    with pytest.raises(ValueError, match=serving.MAX_AGE_GRACE_ENV):
        serving.connection_age_options()
