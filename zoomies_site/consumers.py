"""The event stream on a websocket for the admin (issue 10 item 7), through Channels.

The same frames as GET /api/v1/events, from the same relay, as JSON messages
`{"id", "event", "data"}`; a session whose role is below viewer is refused at connect.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone

from accounts.roles import Level, effective_level
from zoomies_site import stream

# Close codes in the application range: 4401 not signed in, 4403 not allowed.
UNAUTHENTICATED, FORBIDDEN = 4401, 4403


class EventConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHENTICATED)
            return
        if effective_level(user) < Level.READ:
            await self.close(code=FORBIDDEN)
            return
        self.relay = stream.relay()
        self.relay.subscribe()
        await self.channel_layer.group_add(self.relay.group, self.channel_name)
        await self.accept()
        await sync_to_async(self.relay.prime)()
        for frame in await sync_to_async(self.relay.current_summary)(timezone.now()):
            await self.send_json(frame)

    async def disconnect(self, code):
        relay = getattr(self, "relay", None)
        if relay is not None:
            relay.unsubscribe()
            await self.channel_layer.group_discard(relay.group, self.channel_name)

    async def event_frame(self, message):
        await self.send_json(message["frame"])
