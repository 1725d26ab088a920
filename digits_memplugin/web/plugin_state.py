"""The plugin state of the app handling the current request, typed: every view reads it through
`current_plugin()`, not through `current_app.extensions`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import current_app

if TYPE_CHECKING:
    from ..host.extension import MemPlugin


def current_plugin() -> MemPlugin:
    """`extension.get_plugin` of the current app (imported here, at the call: extension imports the web modules)."""
    from ..host.extension import get_plugin

    return get_plugin(current_app._get_current_object())  # type: ignore[attr-defined]
