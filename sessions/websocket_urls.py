from django.urls import path, re_path

from .consumers import SessionConsumer, UnknownRouteConsumer

websocket_urlpatterns = [
    path("ws/sessions/<uuid:session_id>/", SessionConsumer.as_asgi()),
    # Last: any other path (or an upper-case session id) is closed with 4404.
    re_path(r"", UnknownRouteConsumer.as_asgi()),
]
