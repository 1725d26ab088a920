"""The plugin's pages are shown in no other site's frame (clickjacking).

A job page's Cancel, Resume and Delete act in one click. Framed invisibly by another site's page, under a button of
its own, that click would act on the visitor's server: the cross-site check does not see it, since the request
comes from the plugin's own page. So every response of the plugin tells the browser that only pages of its own
origin may frame it: `Content-Security-Policy: frame-ancestors 'self'`, and `X-Frame-Options: SAMEORIGIN` for
browsers that know only that one. A host app that frames the plugin's pages from its own origin (DIGITS serving
both) still may.
"""

from __future__ import annotations

from flask import Response

FRAME_HEADERS = (
    ("Content-Security-Policy", "frame-ancestors 'self'"),
    ("X-Frame-Options", "SAMEORIGIN"),
)


def forbid_framing(response: Response) -> Response:
    """An after_request hook: add the headers, leaving any a view set itself."""
    for name, value in FRAME_HEADERS:
        if name not in response.headers:
            response.headers[name] = value
    return response
