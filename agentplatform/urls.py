from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from billing.api import UsageView
from observability.views import metrics
from restapi.docs import WebsocketProtocolView
from restapi.errors_http import forbidden, json_not_found, json_server_error
from sessions.api import health
from sessions.views import playground
from tools.api import ToolListView

urlpatterns = [
    # The admin's "View site" link (site_url "/") leads here.
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/v1/docs/websocket/", WebsocketProtocolView.as_view(), name="docs-websocket"),
    path(
        "api/v1/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="docs/redoc.html"),
        name="redoc",
    ),
    path("api/v1/", include("sessions.api.urls")),
    path("api/v1/tools/", ToolListView.as_view(), name="tool-list"),
    path("api/v1/usage/", UsageView.as_view(), name="usage"),
    path("api/v1/approvals/", include("approvals.urls")),
    path("api/v1/workflows/", include("workflows.urls")),
    path("api/v1/evaluations/", include("evaluations.urls")),
    path("playground/", playground, name="playground"),
    path("openai/v1/", include("openai_compat.urls")),
]

handler403 = forbidden
handler404 = json_not_found
handler500 = json_server_error
