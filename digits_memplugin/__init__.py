"""digits-memplugin: GPU memory planning for Caffe training in a DIGITS-style Flask app.

The web entry points (`init_app`, `create_app`) are re-exported lazily, so that importing the core
(`digits_memplugin.core`) or a training child process never loads Flask.
"""

from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

if TYPE_CHECKING:  # pragma: no cover
    from .host.app import create_app as create_app
    from .host.extension import init_app as init_app

__all__ = ["__version__", "create_app", "init_app"]


def __getattr__(name: str) -> Any:
    if name == "init_app":
        from .host.extension import init_app

        return init_app
    if name == "create_app":
        from .host.app import create_app

        return create_app
    raise AttributeError(f"module 'digits_memplugin' has no attribute {name!r}")
