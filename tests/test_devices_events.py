"""The `devices` socketio event: pushed every N seconds to the clients that subscribed, and only while there are any.

The app runs in threading mode with a short poll interval; waits are upper bounds (a deadline), never fixed sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_socketio.test_client import SocketIOTestClient

from digits_memplugin import create_app
from digits_memplugin.core.sizes import GIB
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.host.extension import get_plugin

NS = "/memplugin"
DEADLINE = 10.0


@pytest.fixture
def live_app(data_dir: Path) -> Iterator[Flask]:
    """An app polling every 20 ms; afterwards every client is disconnected and the push task has ended."""
    app = create_app(
        {
            "MEMPLUGIN_DATA_DIR": data_dir,
            "MEMPLUGIN_ASYNC_MODE": "threading",
            "MEMPLUGIN_DEVICES_POLL_SECONDS": 0.02,
            "TESTING": True,
        }
    )
    yield app
    plugin = get_plugin(app)
    for client in list(SocketIOTestClient.clients.values()):
        if client.app is app and client.is_connected(NS):
            client.disconnect(NS)
    assert plugin.device_pusher.wait_stopped(DEADLINE)


def connect(app: Flask) -> SocketIOTestClient:
    client = get_plugin(app).socketio.test_client(app, namespace=NS)
    assert [event["name"] for event in client.get_received(NS)] == ["hello"]
    return client


def device_events(client: SocketIOTestClient, at_least: int) -> list[dict[str, Any]]:
    """The payloads of `devices` events received, waiting (up to a deadline) until there are `at_least`."""
    payloads: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE
    while True:
        payloads += [event["args"][0] for event in client.get_received(NS) if event["name"] == "devices"]
        if len(payloads) >= at_least or time.monotonic() > deadline:
            return payloads
        time.sleep(0.005)  # between two looks at what was received


def first_payload_where(client: SocketIOTestClient, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first pushed payload that satisfies `wanted`, waiting up to the deadline; fails the test otherwise."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        for payload in device_events(client, at_least=1):
            if wanted(payload):
                return payload
    pytest.fail("no pushed `devices` event showed the change")


def test_a_subscriber_gets_the_device_list_at_once(
    live_app: Flask, fake_gpus: FakeNvml, fixed_host: devices.HostPaths
) -> None:
    client = connect(live_app)
    client.emit("subscribe_devices", namespace=NS)
    # The first event is emitted in the handler itself, so it is there as soon as emit returns.
    (first, *_) = [event for event in client.get_received(NS) if event["name"] == "devices"]
    assert first["args"][0] == live_app.test_client().get("/memplugin/api/devices").get_json()


def test_pushes_repeat_and_follow_changes(live_app: Flask, fake_gpus: FakeNvml) -> None:
    client = connect(live_app)
    client.emit("subscribe_devices", namespace=NS)
    assert len(device_events(client, at_least=3)) >= 3
    fake_gpus.update(1, memory_used=5 * GIB)  # a process elsewhere takes memory: a later push shows it
    payload = first_payload_where(client, lambda payload: payload["devices"][1]["memory_used"] == 5 * GIB)
    assert payload["devices"][1]["memory_free"] == fake_gpus.gpus[1].free


def test_only_subscribers_get_pushes(live_app: Flask, fake_gpus: FakeNvml) -> None:
    subscriber, bystander = connect(live_app), connect(live_app)
    subscriber.emit("subscribe_devices", namespace=NS)
    assert len(device_events(subscriber, at_least=3)) >= 3  # several pushes have gone out by now
    assert bystander.get_received(NS) == []


def test_nothing_is_read_while_nobody_subscribes(live_app: Flask, fake_gpus: FakeNvml) -> None:
    connect(live_app)
    pusher = get_plugin(live_app).device_pusher
    assert not pusher.running
    assert sum(fake_gpus.calls.values()) == 0


@pytest.mark.parametrize("leave", ["unsubscribe", "disconnect"])
def test_the_push_task_stops_when_the_last_subscriber_leaves(live_app: Flask, fake_gpus: FakeNvml, leave: str) -> None:
    pusher = get_plugin(live_app).device_pusher
    first, second = connect(live_app), connect(live_app)
    first.emit("subscribe_devices", namespace=NS)
    second.emit("subscribe_devices", namespace=NS)
    assert len(pusher.subscribers) == 2 and pusher.running
    device_events(first, at_least=2)
    first.emit("unsubscribe_devices", namespace=NS)
    assert pusher.running  # one subscriber is left
    if leave == "unsubscribe":
        second.emit("unsubscribe_devices", namespace=NS)
    else:
        second.disconnect(NS)
    assert pusher.subscribers == frozenset()
    assert pusher.wait_stopped(DEADLINE)  # the task itself decides to end, within one interval
    assert not pusher.running


def test_subscribing_again_restarts_the_push(live_app: Flask, fake_gpus: FakeNvml) -> None:
    pusher = get_plugin(live_app).device_pusher
    client = connect(live_app)
    client.emit("subscribe_devices", namespace=NS)
    client.emit("unsubscribe_devices", namespace=NS)
    assert pusher.wait_stopped(DEADLINE)
    client.emit("subscribe_devices", namespace=NS)
    assert pusher.running
    assert len(device_events(client, at_least=3)) >= 3


def test_the_interval_comes_from_the_settings(live_app: Flask) -> None:
    assert get_plugin(live_app).device_pusher.interval == 0.02
