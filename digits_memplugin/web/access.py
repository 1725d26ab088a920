"""Who may read and who may write: an API token, a host app's own login, and no cross-site writes.

Three modes, decided per app:

- a host hook (`init_app(app, authorize=...)`): DIGITS or another host decides with its own login; the hook is
  called in the request's context with "read" or "write" and returns whether to allow it;
- a token (MEMPLUGIN_API_TOKEN): writing requests (create, cancel, delete jobs; the model form) need
  ``Authorization: Bearer <token>`` or a page session signed in with the token at ``<prefix>/login``; reading
  requests need it too when MEMPLUGIN_AUTH_READS is on;
- open (the default, for a server bound to 127.0.0.1): anyone who can reach the port may read and write.

In every mode a browser's cross-site write is refused (its Origin names another host), so a page on another site
cannot make a visitor's browser create or cancel jobs.

And in every mode a request must name this server in its Host header: an IP address, localhost, the machine's own
name, or a name in MEMPLUGIN_ALLOWED_HOSTS. A DNS rebinding attack points a name the attacker owns at this server:
the browser then takes the attacker's page and this server for one origin (Origin and Host agree, so the cross-site
check passes), and only the Host header, still the attacker's name, tells them apart.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, current_app, jsonify, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue
from flask_wtf import FlaskForm
from werkzeug.exceptions import Forbidden
from wtforms import PasswordField
from wtforms.validators import DataRequired

from .plugin_state import current_plugin

READ = "read"
WRITE = "write"
Authorizer = Callable[[str], bool]
"""A host's hook: called in the request's context with READ or WRITE; True allows the request."""

SESSION_KEY = "memplugin_auth"
SESSION_SAMESITE = "Lax"
"""The session cookie's SameSite, unless the host chose its own. Lax, not Strict: a browser then sends the cookie
on no request another site's page makes (a form post, a fetch, a frame), and on top-level navigations only, which
are GETs, and no GET writes. Strict would also drop it on the first page reached by a link from elsewhere (a job's
address in a chat), so with `--auth-reads` a signed-in user following it would be sent to sign in again."""
OPEN_ENDPOINTS = {"memplugin.static", "memplugin.login", "memplugin.api_health"}
"""Always reachable: assets, the sign-in page itself, and the liveness probe."""


class LoginForm(FlaskForm):  # type: ignore[misc]
    token = PasswordField("API token", validators=[DataRequired()])


def protect_session_cookie(config: Any) -> bool:
    """Give the app's session cookie SameSite=Lax where its config leaves it unset (Flask's default, None); a host
    that chose a value ("Strict", "Lax", or "None" for a cookie it needs cross-site) keeps it. Whether it was set."""
    if config.get("SESSION_COOKIE_SAMESITE") is not None:
        return False
    config["SESSION_COOKIE_SAMESITE"] = SESSION_SAMESITE
    return True


def token_fingerprint(token: str) -> str:
    """What a signed-in session keeps: changing the token signs every session out."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def host_name(header: str) -> str | None:
    """The name a Host header gives, without its port, lowercased, a final dot dropped; None when it is not one.

    "[::1]:5000" gives "::1"; "Gpu1.Lab.:80" gives "gpu1.lab".
    """
    header = header.strip().lower()
    if header.startswith("["):
        address, bracket, port = header[1:].partition("]")
        if not bracket or (port and not (port[:1] == ":" and port[1:].isdigit() and port[1:].isascii())):
            return None
        return address if _is_address(address) else None
    name, colon, port = header.partition(":")
    if colon and not (port.isdigit() and port.isascii()):
        return None
    name = name[:-1] if name.endswith(".") else name
    if not name or not all(char.isascii() and (char.isalnum() or char in "-._") for char in name):
        return None
    return name


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(header: str | None, names: Iterable[str]) -> bool:
    """Whether a request naming `header` in its Host header is one for this server.

    An IP address is always one: a browser sends it only for a page loaded from that address, which no DNS answer
    can change. A missing Host (HTTP/1.0) is allowed too: browsers always send one. `names` as
    MEMPLUGIN_ALLOWED_HOSTS holds them ("*" for any, ".lab.example" for it and its subdomains).
    """
    if header is None:
        return True
    name = host_name(header)
    if name is None:
        return False
    if _is_address(name):
        return True
    for allowed_name in names:
        if allowed_name == "*" or name == allowed_name.lstrip("."):
            return True
        if allowed_name.startswith(".") and name.endswith(allowed_name):
            return True
    return False


def host_names(settings: Any, config: Any = None) -> tuple[str, ...]:
    """The names this server answers to, besides IP addresses: localhost, the machine's own name, the host app's
    SERVER_NAME when it has one, then MEMPLUGIN_ALLOWED_HOSTS."""
    names = ["localhost", socket.gethostname().lower()]
    server_name = (config or {}).get("SERVER_NAME")
    if isinstance(server_name, str) and server_name:
        names.append(host_name(server_name) or "")
    return tuple(name for name in dict.fromkeys([*names, *settings.allowed_hosts]) if name)


def wrong_host_message(header: str, names: Iterable[str]) -> str:
    shown = header if len(header) <= 100 else header[:100] + "..."
    return (
        f"this server does not answer to the host {shown!r}: requests must name it by an IP address or as "
        f"{', '.join(names)}. A server reached by another name (one bound to 0.0.0.0, or behind a proxy) lists it "
        "in MEMPLUGIN_ALLOWED_HOSTS (`digits-memplugin serve --allowed-host NAME`). This check keeps pages of other "
        "sites out through DNS rebinding."
    )


def check_host() -> ResponseReturnValue | None:
    """Refuse a request whose Host header names a host this server does not answer to (400, JSON)."""
    plugin = current_plugin()
    header = request.environ.get("HTTP_HOST")
    names = host_names(plugin.settings, current_app.config)
    if host_allowed(header, names):
        return None
    return jsonify(error=wrong_host_message(str(header), names), status=400), 400


def socket_host_allowed() -> tuple[bool, str]:
    """The Host check for a socketio connection (in its connect handler): (allowed, why not)."""
    plugin = current_plugin()
    header = request.environ.get("HTTP_HOST")
    names = host_names(plugin.settings, current_app.config)
    if host_allowed(header, names):
        return True, ""
    return False, wrong_host_message(str(header), names)


class HostCheckMiddleware:
    """The Host check in front of a whole WSGI app, the socketio path included: the standalone app refuses a
    rebinding page's websocket before it is opened, not only at the plugin's namespace."""

    def __init__(self, app: Any, names: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.names = names

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_HOST")
        names = tuple(self.names())
        if host_allowed(header, names):
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        body = json.dumps({"error": wrong_host_message(str(header), names), "status": 400}).encode()
        start_response("400 Bad Request", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def request_kind() -> str:
    return READ if request.method in ("GET", "HEAD", "OPTIONS") else WRITE


def cross_site() -> bool:
    """A browser's request from a page of another origin (Origin is sent on cross-site POSTs and by fetch)."""
    origin = request.headers.get("Origin")
    if not origin or origin == "null":
        return origin == "null"
    parts = urlsplit(origin)
    return parts.netloc.lower() != request.host.lower()


def _is_api() -> bool:
    prefix = current_app.config["MEMPLUGIN_URL_PREFIX"].rstrip("/") + "/api"
    return request.path == prefix or request.path.startswith(prefix + "/")


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _deny(status: int, message: str) -> ResponseReturnValue:
    if _is_api() or request.is_json:
        response = jsonify(error=message, status=status)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="digits-memplugin"'
        return response, status
    if status == 401:
        return redirect(url_for("memplugin.login", next=request.full_path))
    raise Forbidden(message)


def allowed(kind: str) -> tuple[bool, int, str]:
    """Whether the current request may do `kind`: (allowed, status when not, why)."""
    plugin = current_plugin()
    settings = plugin.settings
    if kind == WRITE and cross_site():
        return False, 403, "cross-site request refused: this server takes writes from its own pages and API clients"
    if plugin.authorize is not None:
        if plugin.authorize(kind):
            return True, 200, ""
        return False, 403, f"the host application does not allow this {kind}"
    token = settings.api_token
    if token is None or (kind == READ and not settings.auth_reads):
        return True, 200, ""
    given = _bearer()
    if given is not None:
        if hmac.compare_digest(given.encode(), token.encode()):
            return True, 200, ""
        return False, 401, "the API token is wrong"
    if hmac.compare_digest(str(session.get(SESSION_KEY, "")), token_fingerprint(token)):
        return True, 200, ""
    return False, 401, f"this {kind} needs the API token: send 'Authorization: Bearer <token>' or sign in"


def socket_allowed(auth: object) -> bool:
    """A socketio connection reads: allowed as a GET would be, with a token in `auth` ({"token": ...}) counting as
    the bearer (browsers cannot set headers on a websocket)."""
    plugin = current_plugin()
    if plugin.authorize is not None:
        return bool(plugin.authorize(READ))
    token = plugin.settings.api_token
    if token is None or not plugin.settings.auth_reads:
        return True
    given = auth.get("token") if isinstance(auth, dict) else None
    if isinstance(given, str) and hmac.compare_digest(given.encode(), token.encode()):
        return True
    return hmac.compare_digest(str(session.get(SESSION_KEY, "")), token_fingerprint(token))


def check_request() -> ResponseReturnValue | None:
    """The blueprint's before_request: refuse a wrong Host (every endpoint), then what the current mode does not
    allow."""
    wrong_host = check_host()
    if wrong_host is not None:
        return wrong_host
    if request.endpoint in OPEN_ENDPOINTS:
        return None
    ok, status, message = allowed(request_kind())
    if ok:
        return None
    return _deny(status, message)


def login() -> ResponseReturnValue:
    """Sign a browser in with the API token (only when a token is configured)."""
    token = current_plugin().settings.api_token
    form = LoginForm()
    error = None
    if token is None:
        return redirect(url_for("memplugin.home"))
    if form.validate_on_submit():
        if hmac.compare_digest(form.token.data.encode(), token.encode()):
            session[SESSION_KEY] = token_fingerprint(token)
            return redirect(same_site_path(request.args.get("next", "")) or url_for("memplugin.home"))
        error = "That is not the API token."
    status = 401 if request.method == "POST" else 200
    reads = current_plugin().settings.auth_reads
    return render_template("memplugin/login.html", form=form, error=error, reads_need_token=reads), status


def same_site_path(target: str) -> str | None:
    """`target` when it is a path on this server, else None: never a redirect elsewhere.

    Browsers drop tabs and newlines from a URL and read a backslash as a slash, so "/%09/evil.example" (a tab,
    once decoded) and "/" + backslash + "evil.example" lead to evil.example as "//evil.example" does: a control
    character, a space or a backslash anywhere refuses the target, as does one not starting with a single slash.
    """
    if not target.startswith("/") or target.startswith("//"):
        return None
    if any(ord(char) < 0x21 or ord(char) == 0x7F or char == "\\" for char in target):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    return target


def logout() -> ResponseReturnValue:
    session.pop(SESSION_KEY, None)
    return redirect(url_for("memplugin.home"))


def register(blueprint: Blueprint) -> None:
    blueprint.before_request(check_request)
    blueprint.add_url_rule("/login", "login", login, methods=["GET", "POST"])
    blueprint.add_url_rule("/logout", "logout", logout, methods=["POST"])
