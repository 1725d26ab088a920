"""`create_app`: the standalone app that `make run` and `digits-memplugin serve` serve."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from flask import Flask
from flask.typing import ResponseReturnValue
from flask_socketio import SocketIO
from werkzeug.exceptions import HTTPException

from ..web.access import HostCheckMiddleware, check_request, host_names
from ..web.api.envelope import is_api_request, json_error
from ..web.error_pages import error_page
from ..web.frame_guard import forbid_framing
from .extension import init_app
from .settings import Settings


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """A Flask app carrying only the plugin, with its data (SQLite store, job folders) under MEMPLUGIN_DATA_DIR."""
    app = Flask("digits_memplugin.standalone")
    app.config.update(config or {})
    settings = Settings.from_config(app.config)
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = _persistent_secret(settings.data_dir)
    # With a message queue (Redis), events emitted by any of several web workers reach every worker's browsers.
    socketio = SocketIO(app, async_mode=settings.async_mode, message_queue=settings.message_queue)
    plugin = init_app(app, socketio=socketio)
    # Outermost, so that the socketio path is checked too: a rebinding page's websocket is refused before it opens.
    app.wsgi_app = HostCheckMiddleware(app.wsgi_app, lambda: host_names(plugin.settings, app.config))  # type: ignore[method-assign]

    @app.get("/")
    def index() -> ResponseReturnValue:
        """The plugin's home page, served at the root too: the standalone app has nothing else to show. The
        blueprint's access check runs here too, since this route is the app's, not the blueprint's."""
        refused = check_request()
        if refused is not None:
            return refused
        # The blueprint's home view is a plain function (web/pages/pages.py), not a coroutine.
        home = cast(Callable[[], ResponseReturnValue], app.view_functions["memplugin.home"])
        return home()

    # The whole standalone app is the plugin's: its root page and error pages are not to be framed either.
    app.after_request(forbid_framing)

    @app.errorhandler(HTTPException)
    def page_error(error: HTTPException) -> ResponseReturnValue:
        """A URL no route takes (the blueprint's own views have their handler): the site's error page, JSON under
        the API's path. Only here: a host app that carries the plugin keeps its own error pages."""
        return json_error(error) if is_api_request() else error_page(error)

    return app


def _persistent_secret(data_dir: Path) -> str:
    """A secret key kept in the data folder, so sessions and CSRF tokens survive a restart."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "secret_key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
    return path.read_text().strip()
