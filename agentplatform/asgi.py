import os

from django.core.asgi import get_asgi_application

from agentplatform import access_log

# Before daphne's CLI builds its access logger (it imports this module first).
access_log.install()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agentplatform.request_gate import bounded  # noqa: E402
from sessions.websocket_urls import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": bounded(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
