"""The users' and groups' admin in Chromium at 1400 px as a staff user holding view and
change on users and groups but not a superuser (issue 43, least privilege): their own
row's page shows no superuser, staff, groups or permissions to tick, a superuser's row is
out of their reach, and a superuser sees every field. The approvals admin offers nobody a
delete.

Set ADMIN_SHOTS_DIR (e.g. /tmp/user-admin) to keep the screenshots.
"""

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from tests.e2e.test_admin_new_pages_browser import _fits, _login
from tests.e2e.test_admin_pages import CHROMIUM, HAVE_BROWSER, WIDTH, _shot, chromium

PASSWORD = "new-pages-pw"  # the one _login types
GRANTS = ("view_user", "change_user", "view_group", "change_group", "view_approval",
          "change_approval", "delete_approval")  # fmt: skip

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not HAVE_BROWSER, reason=f"needs playwright and Chromium at {CHROMIUM}"),
]


def _people() -> dict[str, Any]:
    users = get_user_model()
    root = users.objects.create_superuser("root-operator", password=PASSWORD)
    staff = users.objects.create_user("user-keeper", password=PASSWORD, is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=GRANTS))
    return {"root": root.pk, "staff": staff.pk}


def test_a_staff_user_with_change_user_sees_no_power_to_grant(live_stack: Any) -> None:
    people = _people()
    base = live_stack.http
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        _login(page, base, "user-keeper")
        page.goto(f"{base}/admin/auth/user/")
        _fits(page)
        _shot(page, "users-as-staff")
        page.goto(f"{base}/admin/auth/user/{people['staff']}/change/")
        _fits(page)
        _shot(page, "own-user-as-staff")
        for field in ("is_superuser", "is_staff", "groups", "user_permissions"):
            assert page.locator(f"[name={field}]").count() == 0, field
        # A superuser's row: not theirs to open (its password would be theirs to set).
        # Django's admin sends a row outside the page's queryset back to the index.
        page.goto(f"{base}/admin/auth/user/{people['root']}/change/")
        assert f"/{people['root']}/change/" not in page.url, page.url
        assert page.locator("[name=username]").count() == 0
        assert "root-operator" not in page.content()
        # The approvals: no delete for anyone, even holding delete_approval.
        page.goto(f"{base}/admin/approvals/approval/")
        _fits(page)
        assert page.locator("option[value=delete_selected]").count() == 0

        _login(page, base, "root-operator")
        page.goto(f"{base}/admin/auth/user/{people['staff']}/change/")
        _fits(page)
        _shot(page, "staff-user-as-superuser")
        for field in ("is_superuser", "is_staff", "user_permissions"):
            assert page.locator(f"[name={field}]").count() >= 1, field
