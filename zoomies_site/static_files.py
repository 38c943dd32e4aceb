"""WhiteNoise that stays out of the way of async views.

WhiteNoise's middleware is sync-only, so under ASGI Django ran it on a thread and every
request below it through `async_to_sync`: each agent's long-poll and each SSE viewer held a
thread for its whole wait, and cancelling the request (a client gone, the server stopping)
never reached the view, which ran its wait out. Here a static file is still served by
WhiteNoise (its file I/O on a worker thread), and everything else is awaited directly.
"""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, *args, **kwargs):
        super().__init__(get_response, *args, **kwargs)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file, thread_sensitive=False)(
                request.path_info
            )
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        return await self.get_response(request)
