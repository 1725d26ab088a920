"""The plugin mounts on a host app (the way DIGITS would load it) and on the standalone app."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask_socketio import SocketIO

import digits_memplugin
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.host.settings import ConfigError


def make_host(tmp_path: Path, **options: object) -> tuple[Flask, SocketIO]:
    host = Flask("host")
    host.config.update(SECRET_KEY="host-secret", MEMPLUGIN_DATA_DIR=str(tmp_path / "plugin-data"))

    @host.get("/")
    def host_index() -> str:
        return "host home"

    socketio = SocketIO(host, async_mode="threading")
    digits_memplugin.init_app(host, socketio, **options)
    return host, socketio


def test_mounts_under_default_prefix_on_host_app(tmp_path: Path) -> None:
    host, _ = make_host(tmp_path)
    client = host.test_client()
    assert client.get("/").text == "host home"  # the host's own routes are untouched
    page = client.get("/memplugin/")
    assert page.status_code == 200
    assert "GPU memory for Caffe training" in page.text
    assert 'href="/memplugin/static/css/memplugin.css"' in page.text
    with client.get("/memplugin/static/css/memplugin.css") as css:
        assert css.status_code == 200
    assert (tmp_path / "plugin-data").is_dir()


def test_mounts_under_custom_prefix_and_stores_state_in_extensions(tmp_path: Path) -> None:
    host, socketio = make_host(tmp_path, url_prefix="/gpu-memory")
    client = host.test_client()
    assert client.get("/gpu-memory/").status_code == 200
    assert client.get("/memplugin/").status_code == 404
    plugin = get_plugin(host)
    assert plugin.socketio is socketio
    assert plugin.settings.url_prefix == "/gpu-memory"
    assert host.config["MEMPLUGIN_URL_PREFIX"] == "/gpu-memory"


def test_socketio_namespace_is_registered_on_the_host_socketio(tmp_path: Path) -> None:
    host, socketio = make_host(tmp_path)
    sio_client = socketio.test_client(host, namespace="/memplugin")
    assert sio_client.is_connected(namespace="/memplugin")
    received = sio_client.get_received(namespace="/memplugin")
    assert [event["name"] for event in received] == ["hello"]
    assert received[0]["args"][0]["version"] == digits_memplugin.__version__


def test_init_app_creates_socketio_when_host_has_none(tmp_path: Path) -> None:
    host = Flask("bare-host")
    host.config["MEMPLUGIN_DATA_DIR"] = str(tmp_path)
    plugin = digits_memplugin.init_app(host, async_mode="threading")
    assert isinstance(plugin.socketio, SocketIO)
    client = plugin.socketio.test_client(host, namespace="/memplugin")
    assert client.is_connected(namespace="/memplugin")


def test_two_apps_in_one_process_keep_their_own_settings(tmp_path: Path) -> None:
    first, _ = make_host(tmp_path / "a", url_prefix="/one")
    second, _ = make_host(tmp_path / "b", url_prefix="/two")
    assert get_plugin(first).settings.url_prefix == "/one"
    assert get_plugin(second).settings.url_prefix == "/two"
    assert first.test_client().get("/one/").status_code == 200
    assert second.test_client().get("/one/").status_code == 404


def test_init_app_twice_is_an_error(tmp_path: Path) -> None:
    host, socketio = make_host(tmp_path)
    with pytest.raises(RuntimeError, match="already called"):
        digits_memplugin.init_app(host, socketio)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"url_prefx": "/x"}, "unknown memplugin option.*url_prefx"),
        ({"url_prefix": "memplugin"}, "MEMPLUGIN_URL_PREFIX must be a path starting with '/'"),
        ({"url_prefix": "/memplugin/"}, "MEMPLUGIN_URL_PREFIX"),
        ({"async_mode": "tornado"}, "MEMPLUGIN_ASYNC_MODE must be one of"),
        ({"data_dir": ""}, "MEMPLUGIN_DATA_DIR must be a non-empty path"),
    ],
)
def test_bad_options_name_the_setting(tmp_path: Path, options: dict[str, object], message: str) -> None:
    host = Flask("host")
    host.config["MEMPLUGIN_DATA_DIR"] = str(tmp_path)
    with pytest.raises(ConfigError, match=message):
        digits_memplugin.init_app(host, SocketIO(host, async_mode="threading"), **options)
    assert "memplugin" not in host.extensions


def test_get_plugin_without_init_app_says_so() -> None:
    with pytest.raises(RuntimeError, match="init_app"):
        get_plugin(Flask("plain"))


def test_standalone_home_page_at_root_and_under_prefix(client) -> None:  # type: ignore[no-untyped-def]
    root = client.get("/")
    assert root.status_code == 200
    assert "GPU memory for Caffe training" in root.text
    assert client.get("/memplugin/").text == root.text


def test_home_page_has_a_banner_when_no_gpu_is_detected(client) -> None:  # type: ignore[no-untyped-def]
    # This machine has no NVIDIA driver: NVML cannot load, and the page says so instead of failing.
    page = client.get("/").text
    assert 'id="no-gpu-banner"' in page
    assert "No GPU detected." in page
    assert "NVML" in page


def test_home_page_links_only_to_pages_that_exist(app: Flask, client) -> None:  # type: ignore[no-untyped-def]
    page = client.get("/").text
    assert 'href="/memplugin/api/health"' in page
    for rule in ("/memplugin/jobs", "/memplugin/new"):
        if not any(r.rule.startswith(rule) for r in app.url_map.iter_rules()):
            assert f'href="{rule}' not in page


def test_standalone_app_keeps_its_secret_key_across_restarts(data_dir: Path) -> None:
    first = digits_memplugin.create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading"})
    second = digits_memplugin.create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading"})
    assert first.config["SECRET_KEY"] == second.config["SECRET_KEY"]
    assert len(first.config["SECRET_KEY"]) == 64
    assert (data_dir / "secret_key").stat().st_mode & 0o077 == 0


def test_the_plugin_state_is_read_through_its_typed_accessor() -> None:
    """Views read the plugin through web.plugin_state.current_plugin (get_plugin, typed), never the raw extensions
    table: 39 lookups were `current_app.extensions["memplugin"]`, untyped (one hid that the estimate pool was
    optional)."""
    package = Path(digits_memplugin.__file__).parent
    raw = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py") if path.name != "extension.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ".extensions[" in line
    ]
    assert raw == []
    assert (package / "host" / "extension.py").read_text(encoding="utf-8").count(".extensions[EXTENSION_KEY]") == 2  # set in init_app, read in get_plugin
