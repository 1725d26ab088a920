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
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from urllib.parse import urlsplit

from flask import Blueprint, current_app, jsonify, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue
from flask_wtf import FlaskForm
from werkzeug.exceptions import Forbidden
from wtforms import PasswordField
from wtforms.validators import DataRequired

READ = "read"
WRITE = "write"
Authorizer = Callable[[str], bool]
"""A host's hook: called in the request's context with READ or WRITE; True allows the request."""

SESSION_KEY = "memplugin_auth"
OPEN_ENDPOINTS = {"memplugin.static", "memplugin.login", "memplugin.api_health"}
"""Always reachable: assets, the sign-in page itself, and the liveness probe."""


class LoginForm(FlaskForm):  # type: ignore[misc]
    token = PasswordField("API token", validators=[DataRequired()])


def token_fingerprint(token: str) -> str:
    """What a signed-in session keeps: changing the token signs every session out."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


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
    plugin = current_app.extensions["memplugin"]
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
    plugin = current_app.extensions["memplugin"]
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
    """The blueprint's before_request: refuse what the current mode does not allow."""
    if request.endpoint in OPEN_ENDPOINTS:
        return None
    ok, status, message = allowed(request_kind())
    if ok:
        return None
    return _deny(status, message)


def login() -> ResponseReturnValue:
    """Sign a browser in with the API token (only when a token is configured)."""
    token = current_app.extensions["memplugin"].settings.api_token
    form = LoginForm()
    error = None
    if token is None:
        return redirect(url_for("memplugin.home"))
    if form.validate_on_submit():
        if hmac.compare_digest(form.token.data.encode(), token.encode()):
            session[SESSION_KEY] = token_fingerprint(token)
            target = request.args.get("next", "")
            # Only a path on this server: never a redirect elsewhere.
            if not target.startswith("/") or target.startswith("//"):
                target = url_for("memplugin.home")
            return redirect(target)
        error = "That is not the API token."
    status = 401 if request.method == "POST" else 200
    reads = current_app.extensions["memplugin"].settings.auth_reads
    return render_template("memplugin/login.html", form=form, error=error, reads_need_token=reads), status


def logout() -> ResponseReturnValue:
    session.pop(SESSION_KEY, None)
    return redirect(url_for("memplugin.home"))


def register(blueprint: Blueprint) -> None:
    blueprint.before_request(check_request)
    blueprint.add_url_rule("/login", "login", login, methods=["GET", "POST"])
    blueprint.add_url_rule("/logout", "logout", logout, methods=["POST"])
