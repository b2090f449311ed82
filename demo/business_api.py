"""A small business API over HTTP, the kind of system customers plug in as tools.

Run by `make run` (Procfile `demoapi`). It honours `Idempotency-Key`: a repeated
key returns the first result instead of issuing a second coupon, and
`GET /coupons/status?idempotency_key=K` tells whether a call with that key took
effect (what a platform probes after a crash).
"""

import hashlib
import json
import logging
import secrets
from decimal import Decimal, InvalidOperation
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.db import IntegrityError, close_old_connections, transaction

from .models import ApiRequestLog, Coupon, Customer, Order

logger = logging.getLogger(__name__)


def _coupon_body(coupon: Coupon, duplicate: bool) -> dict[str, Any]:
    return {
        "ok": True,
        "coupon_code": coupon.code,
        "customer_id": coupon.customer_id,
        "amount": f"{Decimal(coupon.amount):.2f}",
        "duplicate": duplicate,
    }


def issue_coupon(payload: Any, key: str) -> tuple[int, dict[str, Any]]:
    if not key:
        return 400, {"ok": False, "error": "the Idempotency-Key header is required"}
    if not isinstance(payload, dict):
        return 400, {"ok": False, "error": "send a JSON object"}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    existing = Coupon.objects.filter(idempotency_key=key).first()
    if existing is not None:
        if existing.request_hash != digest:
            return 409, {
                "ok": False,
                "error": "this Idempotency-Key was used with a different request",
            }
        return 200, _coupon_body(existing, duplicate=True)
    customer = (
        Customer.objects.filter(pk=payload.get("customer_id")).first()
        if isinstance(payload.get("customer_id"), int)
        else None
    )
    if customer is None:
        return 404, {"ok": False, "error": f"customer {payload.get('customer_id')!r} not found"}
    try:
        amount = Decimal(str(payload.get("amount")))
    except InvalidOperation:
        return 400, {"ok": False, "error": "amount must be a number"}
    if not Decimal("0") < amount <= Decimal("100"):
        return 422, {"ok": False, "error": "amount must be between 0 and 100"}
    try:
        with transaction.atomic():
            coupon = Coupon.objects.create(
                code="CPN-" + secrets.token_hex(4).upper(),
                customer=customer,
                amount=amount,
                reason=str(payload.get("reason") or "")[:500],
                idempotency_key=key,
                request_hash=digest,
            )
    except IntegrityError:  # the same key raced in from a retry: the first one won
        return 200, _coupon_body(Coupon.objects.get(idempotency_key=key), duplicate=True)
    return 201, _coupon_body(coupon, duplicate=False)


def coupon_status(key: str) -> tuple[int, dict[str, Any]]:
    coupon = Coupon.objects.filter(idempotency_key=key).first() if key else None
    if coupon is None:
        return 404, {"status": "unknown"}
    return 200, {"status": "done", "result": _coupon_body(coupon, duplicate=True)}


def order_details(number: str) -> tuple[int, dict[str, Any]]:
    order = Order.objects.select_related("customer").filter(number=number).first()
    if order is None:
        return 404, {"ok": False, "error": f"order {number} not found; check the order number"}
    return 200, {
        "ok": True,
        "order_number": order.number,
        "customer_id": order.customer_id,
        "customer_name": order.customer.name,
        "amount": str(order.amount),
        "logistics_status": order.logistics_status,
        "exception": order.exception_reason,
    }


class Handler(BaseHTTPRequestHandler):
    server_version = "DemoBusinessAPI/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.info("%s %s", self.address_string(), format % args)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        close_old_connections()
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        key = self.headers.get("Idempotency-Key", "")
        try:
            if method == "POST" and url.path == "/coupons":
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    payload = json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    status, body = 400, {"ok": False, "error": "body is not valid JSON"}
                else:
                    status, body = issue_coupon(payload, key)
            elif method == "GET" and url.path == "/coupons/status":
                status, body = coupon_status((query.get("idempotency_key") or [""])[0])
            elif method == "GET" and url.path == "/orders/lookup":
                status, body = order_details((query.get("number") or [""])[0])
            elif method == "GET" and url.path.startswith("/orders/"):
                status, body = order_details(url.path.removeprefix("/orders/"))
            elif method == "GET" and url.path == "/healthz":
                status, body = 200, {"status": "ok"}
            else:
                status, body = 404, {"ok": False, "error": f"no route {method} {url.path}"}
            ApiRequestLog.objects.create(
                method=method, path=url.path[:200], idempotency_key=key[:200], status=status
            )
        except Exception:  # noqa: BLE001 - a demo server answers 500 rather than dying
            logger.exception("demo business API failed")
            status, body = (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"ok": False, "error": "internal error"},
            )
        finally:
            close_old_connections()
        self._reply(int(status), body)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")


def serve(host: str, port: int) -> None:
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    logger.info("demo business API on http://%s:%d", host, port)
    try:
        server.serve_forever()
    finally:
        server.server_close()
