"""The demo agent's tools: read orders, notify customers, write a report."""

from datetime import timedelta
from typing import Any

from django.utils import timezone

from tools.registry import tool_handler

from .models import Customer, Notification, Order, Report


@tool_handler("demo.query_orders")
def query_orders(days: int = 7, logistics_status: str = "exception") -> dict[str, Any]:
    since = timezone.now() - timedelta(days=days)
    orders = (
        Order.objects.select_related("customer")
        .filter(placed_at__gte=since, logistics_status=logistics_status)
        .order_by("placed_at", "id")
    )
    rows = [
        {
            "order_number": o.number,
            "customer_id": o.customer_id,
            "customer_name": o.customer.name,
            "placed_at": o.placed_at.date().isoformat(),
            "exception": o.exception_reason,
        }
        for o in orders
    ]
    return {"count": len(rows), "days": days, "logistics_status": logistics_status, "orders": rows}


@tool_handler("demo.send_notification", wants_idempotency_key=True)
def send_notification(
    customer_id: int, message: str, idempotency_key: str, order_number: str = ""
) -> dict[str, Any]:
    customer = Customer.objects.filter(pk=customer_id).first()
    if customer is None:
        return {"ok": False, "error": f"customer {customer_id} not found"}
    order = Order.objects.filter(number=order_number).first() if order_number else None
    # The idempotency key makes a re-executed step a no-op, not a second message.
    note, created = Notification.objects.get_or_create(
        idempotency_key=idempotency_key,
        defaults={"customer": customer, "order": order, "message": message},
    )
    return {
        "ok": True,
        "notification_id": note.pk,
        "customer": customer.name,
        "duplicate": not created,
    }


@tool_handler("demo.generate_report", wants_idempotency_key=True)
def generate_report(title: str, lines: list[str], idempotency_key: str) -> dict[str, Any]:
    body = "\n".join(f"- {line}" for line in lines)
    report, _ = Report.objects.get_or_create(
        idempotency_key=idempotency_key, defaults={"title": title, "body": body}
    )
    return {"ok": True, "report_id": report.pk, "title": report.title, "lines": len(lines)}
