"""The project's own error type. Anything the plugin rejects raises a subclass, with a message a user can act on."""

from __future__ import annotations


class MemPluginError(Exception):
    """Base of every error digits-memplugin raises on purpose."""
