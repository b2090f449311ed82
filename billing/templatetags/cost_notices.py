"""The cost notices' banner on every admin page (templates/admin/base_site.html)."""

from typing import Any

from django import template

from billing.selectors import notices_banner

register = template.Library()

# A banner is a summary: the notices page lists them all.
BANNER_LIMIT = 5


@register.inclusion_tag("admin/billing/notice_banner.html", takes_context=True)
def cost_notice_banner(context: dict[str, Any]) -> dict[str, Any]:
    """The open notices for an operator (a superuser: notices span every tenant); nothing,
    and no query, for anyone else or a page without a signed-in user."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_superuser", False):
        return {"notices": [], "more": 0}
    notices, more = notices_banner(limit=BANNER_LIMIT)
    return {
        "notices": notices,
        "more": more,
        "next": request.get_full_path() if request is not None else "",
    }
