"""Plain-Django error handlers, so even a URL that matches nothing answers in the API's shape,
and a refusal in the admin is one of the admin's own pages."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from .errors import error_body


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404: the API's shape; in the admin, the admin's own page."""
    if request.path.startswith(reverse("admin:index")):
        return _admin_page(request, "admin/404.html", "Not found", 404)
    return JsonResponse(error_body("not_found", f"no such resource: {request.path}"), status=404)


def json_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        error_body("internal_error", "something went wrong on our side; it has been logged"),
        status=500,
    )


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403: in the admin, the admin's page saying what happened and where to go (not a bare
    "403 Forbidden"); anywhere else, the API's shape."""
    if request.path.startswith(reverse("admin:index")):
        return _admin_page(request, "admin/403.html", "Not allowed", 403, str(exception or ""))
    return JsonResponse(error_body("permission_denied", "you may not do this here"), status=403)


def _same_site(request: HttpRequest, url: str) -> str:
    """`url` if it is a page of this site (a link back), else ""."""
    return url if url.startswith(request.build_absolute_uri("/")) else ""


def _admin_page(
    request: HttpRequest, template: str, title: str, status: int, reason: str = ""
) -> HttpResponse:
    user = getattr(request, "user", None)
    context = {
        **admin.site.each_context(request),
        "title": title,
        "username": user.get_username() if user is not None else "",
        "reason": reason,
        "back": _same_site(request, request.META.get("HTTP_REFERER", "")),
    }
    return TemplateResponse(request, template, context, status=status).render()
