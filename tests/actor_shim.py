"""An object answering ``handle.method.remote(...)`` as a Ray actor handle does, for unit tests of code that holds
actor handles (verl's agent-loop worker and its clients) without starting a Ray cluster."""

from __future__ import annotations

import asyncio


class AsActor:
    """``obj.method.remote(...)`` answered as a Ray actor answers it (an awaitable), counting calls by name."""

    def __init__(self, obj):
        self.obj, self.calls = obj, []

    def __getattr__(self, name):
        method, calls = getattr(self.obj, name), self.calls

        class Remote:
            @staticmethod
            def remote(*args, **kwargs):
                calls.append(name)
                result = method(*args, **kwargs)
                if asyncio.iscoroutine(result):
                    return result

                async def done():
                    return result
                return done()
        return Remote()
