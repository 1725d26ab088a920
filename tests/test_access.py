"""Who may read and write: the open default, the API token (bearer and signed-in pages), the host's own login
hook, the socketio connection, and no cross-site writes in any mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_socketio import SocketIO

import digits_memplugin
from digits_memplugin import create_app
from digits_memplugin.host.settings import ConfigError

TOKEN = "s3cret-token-of-some-length"
API = "/memplugin/api"


def app_with(data_dir: Path, **config: Any) -> Flask:
    return create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True,
                       **config})


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_open_by_default_but_no_cross_site_writes(data_dir: Path) -> None:
    client = app_with(data_dir).test_client()
    assert client.get(f"{API}/jobs").status_code == 200
    # A job request that is wrong is a 400, not a 401: writing is open.
    assert client.post(f"{API}/jobs", json={}).status_code == 400
    # A page of another site posting through the visitor's browser is refused, before the request is looked at.
    refused = client.post(f"{API}/jobs", json={}, headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403
    assert "cross-site" in refused.get_json()["error"]
    same_site = client.post(f"{API}/jobs", json={}, headers={"Origin": "http://localhost"})
    assert same_site.status_code == 400
    assert client.post(f"{API}/jobs", json={}, headers={"Origin": "null"}).status_code == 403


def test_a_token_guards_writes_and_leaves_reads_open(data_dir: Path) -> None:
    client = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN).test_client()
    assert client.get(f"{API}/jobs").status_code == 200
    assert client.get("/memplugin/").status_code == 200
    missing = client.post(f"{API}/jobs", json={})
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert "API token" in missing.get_json()["error"]
    wrong = client.post(f"{API}/jobs", json={}, headers=bearer("not-the-token-at-all-no"))
    assert wrong.status_code == 401 and "wrong" in wrong.get_json()["error"]
    assert client.post(f"{API}/jobs", json={}, headers=bearer()).status_code == 400  # past the check: validation
    assert client.delete(f"{API}/jobs/nope").status_code == 401
    assert client.delete(f"{API}/jobs/nope", headers=bearer()).status_code == 404
    assert client.post(f"{API}/jobs/nope/cancel").status_code == 401
    # the estimate is a computation, not a change: a POST, so it needs the token too (it may spawn pycaffe)
    assert client.post(f"{API}/estimate", json={}).status_code == 401


def test_reads_can_be_closed_too(data_dir: Path) -> None:
    client = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN, MEMPLUGIN_AUTH_READS=True).test_client()
    assert client.get(f"{API}/jobs").status_code == 401
    assert client.get(f"{API}/devices").status_code == 401
    assert client.get(f"{API}/jobs", headers=bearer()).status_code == 200
    # the liveness probe and the assets stay open; pages send the browser to sign in
    assert client.get(f"{API}/health").status_code == 200
    with client.get("/memplugin/static/css/memplugin.css") as css:
        assert css.status_code == 200
    page = client.get("/memplugin/jobs")
    assert page.status_code == 302 and "/memplugin/login" in page.headers["Location"]
    root = client.get("/")
    assert root.status_code == 302 and "/memplugin/login" in root.headers["Location"]


def csrf_token(client: Any, path: str) -> str:
    import re

    page = client.get(path).get_data(as_text=True)
    match = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page) or re.search(
        r'name="csrf_token" value="([^"]+)"', page
    )
    assert match, page[:500]
    return match.group(1)


def test_signing_in_with_the_token_opens_the_pages_and_the_api_to_that_browser(data_dir: Path) -> None:
    app = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN, MEMPLUGIN_AUTH_READS=True, WTF_CSRF_ENABLED=True)
    client = app.test_client()
    token = csrf_token(client, "/memplugin/login")
    wrong = client.post("/memplugin/login", data={"token": "nope", "csrf_token": token})
    assert wrong.status_code == 401 and "That is not the API token." in wrong.get_data(as_text=True)
    signed_in = client.post("/memplugin/login?next=/memplugin/jobs", data={"token": TOKEN, "csrf_token": token})
    assert signed_in.status_code == 302 and signed_in.headers["Location"].endswith("/memplugin/jobs")
    assert client.get("/memplugin/jobs").status_code == 200
    assert client.get(f"{API}/jobs").status_code == 200  # the pages' own scripts use the session
    assert client.post(f"{API}/jobs", json={}).status_code == 400
    # an open redirect is refused: `next` must be a path on this server
    again = client.post("/memplugin/login?next=//evil.example/x", data={"token": TOKEN, "csrf_token": token})
    assert again.headers["Location"] == "/memplugin/"
    client.post("/memplugin/logout")
    assert client.get(f"{API}/jobs").status_code == 401


def test_a_changed_token_signs_every_session_out(data_dir: Path) -> None:
    first = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN, MEMPLUGIN_AUTH_READS=True)
    client = first.test_client()
    token = csrf_token(client, "/memplugin/login")
    client.post("/memplugin/login", data={"token": TOKEN, "csrf_token": token})
    assert client.get(f"{API}/jobs").status_code == 200
    second = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN + "-rotated", MEMPLUGIN_AUTH_READS=True)
    moved = second.test_client()
    with client.session_transaction() as old_session:
        cookie = dict(old_session)
    with moved.session_transaction() as new_session:
        new_session.update(cookie)
    assert moved.get(f"{API}/jobs").status_code == 401


def test_the_host_decides_with_its_own_login(tmp_path: Path) -> None:
    asked: list[str] = []

    def authorize(kind: str) -> bool:
        from flask import request

        asked.append(kind)
        return request.headers.get("X-Host-User") == "admin" or kind == "read"

    host = Flask("host")
    host.config.update(SECRET_KEY="x", MEMPLUGIN_DATA_DIR=str(tmp_path), MEMPLUGIN_API_TOKEN=TOKEN)
    socketio = SocketIO(host, async_mode="threading")
    digits_memplugin.init_app(host, socketio, authorize=authorize)
    client = host.test_client()
    assert client.get(f"{API}/jobs").status_code == 200
    refused = client.post(f"{API}/jobs", json={}, headers=bearer())  # the token does not count: the host decides
    assert refused.status_code == 403 and "host application" in refused.get_json()["error"]
    assert client.post(f"{API}/jobs", json={}, headers={"X-Host-User": "admin"}).status_code == 400
    assert asked == ["read", "write", "write"]
    with pytest.raises(TypeError, match="authorize must be a callable"):
        digits_memplugin.init_app(Flask("other"), SocketIO(async_mode="threading"), authorize="yes")  # type: ignore[arg-type]


def test_socketio_connections_follow_the_read_rule(data_dir: Path) -> None:
    app = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN, MEMPLUGIN_AUTH_READS=True)
    socketio = app.extensions["memplugin"].socketio
    refused = socketio.test_client(app, namespace="/memplugin")
    assert not refused.is_connected(namespace="/memplugin")
    allowed = socketio.test_client(app, namespace="/memplugin", auth={"token": TOKEN})
    assert allowed.is_connected(namespace="/memplugin")
    assert [event["name"] for event in allowed.get_received(namespace="/memplugin")] == ["hello"]
    open_app = app_with(data_dir / "open", MEMPLUGIN_API_TOKEN=TOKEN)
    assert open_app.extensions["memplugin"].socketio.test_client(open_app, namespace="/memplugin").is_connected(
        namespace="/memplugin"
    )


@pytest.mark.parametrize("token", ["short", " padded-token-with-spaces ", 12345678901234567890])
def test_weak_or_malformed_tokens_are_refused_at_start_up(data_dir: Path, token: object) -> None:
    with pytest.raises(ConfigError, match="MEMPLUGIN_API_TOKEN"):
        app_with(data_dir, MEMPLUGIN_API_TOKEN=token)


# ============================================================================ the session cookie and framing


def session_cookie(response: Any) -> str:
    [cookie] = [value for name, value in response.headers.items() if name == "Set-Cookie" and value.startswith("session=")]
    return cookie


def test_the_session_cookie_of_a_signed_in_browser_is_samesite_lax(data_dir: Path) -> None:
    """Issue 23 item 8: the session that carries a sign-in had no SameSite, so a browser without Lax by default sent
    it on another site's requests. Lax: sent on top-level navigations only (GETs, which write nothing)."""
    client = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN, MEMPLUGIN_AUTH_READS=True).test_client()
    signed_in = client.post("/memplugin/login", data={"token": TOKEN, "csrf_token": csrf_token(client, "/memplugin/login")})
    assert signed_in.status_code == 302
    cookie = session_cookie(signed_in)
    assert "SameSite=Lax" in cookie and "HttpOnly" in cookie, cookie
    assert client.get(f"{API}/jobs").status_code == 200  # the harness: this cookie is the sign-in


def host_app(tmp_path: Path, **config: Any) -> Flask:
    host = Flask("host")
    host.config.update(SECRET_KEY="x", MEMPLUGIN_DATA_DIR=str(tmp_path / "data"), **config)

    @host.get("/host-page")
    def host_page() -> str:
        from flask import session

        session["seen"] = True
        return "the host's own page"

    digits_memplugin.init_app(host, SocketIO(host, async_mode="threading"))
    return host


@pytest.mark.parametrize(
    ("given", "expected"),
    [({}, "Lax"), ({"SESSION_COOKIE_SAMESITE": "Strict"}, "Strict"), ({"SESSION_COOKIE_SAMESITE": "Lax"}, "Lax"),
     ({"SESSION_COOKIE_SAMESITE": "None", "SESSION_COOKIE_SECURE": True}, "None")],
    ids=["unset", "strict", "lax", "none"],
)
def test_a_host_app_that_chose_its_own_samesite_keeps_it(tmp_path: Path, given: dict[str, Any], expected: str) -> None:
    """On a host app the session cookie is the host's: one it never set up (Flask's None) gets Lax; a choice of its
    own, "None" for a cookie it needs cross-site included, is kept."""
    host = host_app(tmp_path, **given)
    assert host.config["SESSION_COOKIE_SAMESITE"] == expected
    assert f"SameSite={expected}" in session_cookie(host.test_client().get("/host-page"))


FRAMED_PATHS = [
    "/", "/memplugin/", "/memplugin/devices", "/memplugin/jobs", "/memplugin/jobs/nope", "/memplugin/models/new",
    "/memplugin/login", "/memplugin/static/css/memplugin.css", f"{API}/jobs", f"{API}/nope", "/no-such-page",
]


@pytest.mark.parametrize("path", FRAMED_PATHS)
def test_every_response_of_the_plugin_may_be_framed_by_its_own_origin_only(data_dir: Path, path: str) -> None:
    """Issue 23 item 8: pages sent no frame-ancestors nor X-Frame-Options, so another site could frame a job page
    under a button of its own and have the visitor click Delete (clickjacking)."""
    client = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN).test_client()
    with client.get(path) as response:
        assert response.status_code in (200, 302, 404), (path, response.status_code)
        assert response.headers.get("Content-Security-Policy") == "frame-ancestors 'self'", (path, response.headers)
        assert response.headers.get("X-Frame-Options") == "SAMEORIGIN", (path, response.headers)


def test_on_a_host_app_the_plugins_pages_refuse_framing_and_the_hosts_are_left_alone(tmp_path: Path) -> None:
    client = host_app(tmp_path).test_client()
    for path in ("/memplugin/", "/memplugin/jobs", f"{API}/health"):
        headers = client.get(path).headers
        assert headers.get("Content-Security-Policy") == "frame-ancestors 'self'" and headers.get(
            "X-Frame-Options") == "SAMEORIGIN", (path, headers)
    own = client.get("/host-page").headers
    assert "Content-Security-Policy" not in own and "X-Frame-Options" not in own
