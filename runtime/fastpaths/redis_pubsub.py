"""Frames published from the committing thread, on channels_redis's Pub/Sub layer.

The public way to reach a group, `await layer.group_send(...)`, needs the event
loop: a hop to the process's io loop and a round trip to Redis per frame. Here
the committing thread writes the PUBLISH commands itself, to the process's one
publishing connection per shard (runtime/redis_publisher.py), naming the group's
channel and picking its shard exactly as the subscribers' loop layer does.

That naming reads channels_redis internals (`RedisPubSubChannelLayer._args` /
`_kwargs`, `RedisPubSubLoopLayer._get_group_channel_name`, `_get_shard`,
`_shards`); the versions it was written for are in runtime/fastpaths/__init__.py.
`route()` answers None (publish through `group_send`) where the layer is another
kind, the release lacks those parts, or the fast path is off.
"""

import logging
import threading
from dataclasses import dataclass
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer

from runtime import fastpaths, redis_publisher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """Where a group's frames go on the Pub/Sub layer: its channel names and hosts."""

    layer: RedisPubSubChannelLayer
    names: RedisPubSubLoopLayer  # only its pure functions: the group's channel, its shard
    publishers: dict[int, redis_publisher.Publisher]  # by id() of the names' shard

    def publish(self, group: str, messages: list[dict[str, Any]]) -> None:
        channel = self.names._get_group_channel_name(group)
        publisher = self.publishers[id(self.names._get_shard(channel))]
        publisher.publish(channel.encode(), [self.layer.serialize(m) for m in messages])


_routes: dict[int, tuple[Any, Route | None]] = {}
_routes_lock = threading.Lock()


def route(layer: Any) -> Route | None:
    """The layer's route for direct publishing, or None: publish through `group_send`."""
    if not fastpaths.enabled("redis_pubsub"):
        return None
    known = _routes.get(id(layer))
    if known is not None and known[0] is layer:
        return known[1]
    with _routes_lock:  # one route a layer: two would be two connections, out of order
        known = _routes.get(id(layer))
        if known is not None and known[0] is layer:
            return known[1]
        found: Route | None = None
        if isinstance(layer, RedisPubSubChannelLayer):
            try:
                # A loop layer built here (no loop needed) names the group's channel and
                # picks its shard exactly as the subscribers' does.
                names = RedisPubSubLoopLayer(*layer._args, **layer._kwargs, channel_layer=layer)
                names._get_shard(names._get_group_channel_name("probe"))
                if any("master_name" in shard.host for shard in names._shards):
                    # Sentinel: redis-py's asyncio client follows the master; ours does not.
                    raise ValueError("a Sentinel host")
                publishers = {
                    id(shard): redis_publisher.Publisher(shard.host) for shard in names._shards
                }
                found = Route(layer, names, publishers)
            except (AttributeError, TypeError, ValueError) as error:
                logger.warning("frames go through group_send: %s", error)
        _routes[id(layer)] = (layer, found)
        return found
