"""A nursery owned by a client object, for its background tasks (socket readers, sender).

``async with Producer(...)`` has to open a nursery that outlives ``__aenter__``; this
keeps that one awkward pattern in one place. Closing cancels the tasks: they only
ever serve the object that owns them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import trio

from minibroker.client.cluster import Cluster
from minibroker.client.config import load_client_config


class Background:
    def __init__(self) -> None:
        self._cm: Any = None
        self.nursery: trio.Nursery | None = None

    async def open(self) -> trio.Nursery:
        self._cm = trio.open_nursery()
        self.nursery = await self._cm.__aenter__()
        return self.nursery

    async def close(self, error: BaseException | None = None) -> None:
        """Cancel the background tasks and wait for them; must run in the task that opened."""
        cm, nursery = self._cm, self.nursery
        self._cm = self.nursery = None
        if cm is None:
            return
        nursery.cancel_scope.cancel()
        await cm.__aexit__(
            type(error) if error else None, error, error.__traceback__ if error else None
        )


class ClusterClient:
    """What Producer, Admin and Consumer share: config by role, a Cluster in a Background.

    ``async with`` opens the nursery, connects and reads metadata once (so a wrong
    bootstrap fails here, not on first use), then runs :meth:`_started` for a subclass's
    own background tasks; closing shuts connections, then tasks.
    """

    ROLE = ""

    def __init__(
        self, bootstrap: str | None = None, config: Mapping[str, Any] | None = None, **settings: Any
    ) -> None:
        self.config = load_client_config(self.ROLE, bootstrap, config, settings)
        self._background = Background()
        self._cluster: Cluster | None = None

    async def __aenter__(self) -> Self:
        nursery = await self._background.open()
        try:
            self._cluster = Cluster(self.config, nursery)
            await self._cluster.refresh(())
            await self._started(nursery)
        except BaseException:
            await self.aclose()
            raise
        return self

    def metrics(self) -> dict[str, Any]:
        """Quota throttles per broker (Kafka's produce/fetch-throttle-time-avg and -max)."""
        throttles = self._cluster.throttles.snapshot() if self._cluster is not None else {}
        return {"throttle": throttles}

    async def _started(self, nursery: trio.Nursery) -> None:
        """Hook: start the subclass's background tasks (metadata is known by now)."""

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        try:
            if self._cluster is not None:
                await self._cluster.aclose()
        finally:
            await self._background.close()
