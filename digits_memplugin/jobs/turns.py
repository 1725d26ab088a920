"""Taking turns with the server's other work while a long loop runs in its one thread.

Under gevent (`serve`) the server is one thread: a loop of a few thousand cheap steps (the paths of a long list
checked again before an attempt starts) answers nothing else while it runs. `Turns.take`, called at each step,
lets the hub run the other greenlets every `every` seconds, so such a loop delays a request by that much at most.
Outside gevent (a threaded host, the command line) other threads run anyway, and it does nothing.
"""

from __future__ import annotations

import sys
import time

TURN_SECONDS = 0.02
"""How long a loop runs before it lets the others run (a request waits at most about this long for it)."""
PAUSE_SECONDS = 0.001
"""How long the loop then sleeps: a timer, so that gevent's hub goes round its loop (sockets, timers) once."""


class Turns:
    """A loop's turns: `take()` at each step yields to gevent's hub once `every` seconds have passed."""

    def __init__(self, every: float = TURN_SECONDS) -> None:
        self.every = every
        self._next = time.monotonic() + every
        self.taken = 0
        """Turns given to the others so far (for tests)."""

    def take(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        if _cooperative():
            import gevent

            # Not sleep(0): that only runs the greenlets already ready, and the hub polls neither sockets nor
            # timers before this one runs again (a request waiting to be read would wait for the whole loop).
            gevent.sleep(PAUSE_SECONDS)
            self.taken += 1


def _cooperative() -> bool:
    """Whether gevent has patched this process (then the server's requests are greenlets of this thread)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("time"))
