import os

from django.core.asgi import get_asgi_application

from agentplatform import access_log

# Before daphne's CLI builds its access logger (it imports this module first).
access_log.install()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from approvals.consumers import ApprovalsConsumer  # noqa: E402
from sessions.websocket_urls import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(
            # Before the sessions' routes: their last one closes any other path with 4404.
            [path("ws/approvals/", ApprovalsConsumer.as_asgi()), *websocket_urlpatterns]
        ),
    }
)
