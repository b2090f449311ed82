import os

import django

from agentplatform import access_log

# Before daphne's CLI builds its access logger (it imports this module first).
access_log.install()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application()

from runtime.fastpaths.asgi_threads import http_application  # noqa: E402

django_asgi_app = http_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from agentplatform.request_gate import bounded  # noqa: E402
from approvals.consumers import ApprovalsConsumer  # noqa: E402
from sessions.websocket_urls import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": bounded(django_asgi_app),
        "websocket": URLRouter(
            # Before the sessions' routes: their last one closes any other path with 4404.
            # The approvers' socket also takes the admin's signed-in user (the queue page).
            [
                path("ws/approvals/", AuthMiddlewareStack(ApprovalsConsumer.as_asgi())),
                *websocket_urlpatterns,
            ]
        ),
    }
)

from django.conf import settings  # noqa: E402

from agentplatform import gc_tuning  # noqa: E402

if settings.GC_LOG_PAUSES:
    gc_tuning.log_pauses()
if settings.GC_FREEZE:
    # The application is loaded: what exists now lives as long as the process.
    gc_tuning.freeze_after_start(threshold0=settings.GC_THRESHOLD0)
