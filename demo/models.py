"""A tiny order-support business the offline demo agent works on."""

from django.db import models


class Customer(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField()

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    number = models.CharField(max_length=30, unique=True)
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    placed_at = models.DateTimeField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    logistics_status = models.CharField(max_length=20, default="ok")
    exception_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["logistics_status", "placed_at"], name="order_logistics_placed")
        ]

    def __str__(self) -> str:
        return self.number


class Notification(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="notifications")
    order = models.ForeignKey(Order, on_delete=models.SET_NULL, null=True, blank=True)
    message = models.TextField()
    idempotency_key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"to {self.customer_id}: {self.message[:40]}"


class Report(models.Model):
    title = models.CharField(max_length=200)
    body = models.TextField()
    idempotency_key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.title


class Coupon(models.Model):
    """Issued by the demo business API (an HTTP tool) exactly once per idempotency key."""

    code = models.CharField(max_length=20, unique=True)
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="coupons")
    amount = models.DecimalField(max_digits=8, decimal_places=2)
    reason = models.CharField(max_length=500, blank=True)
    idempotency_key = models.CharField(max_length=200, unique=True)
    request_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.code


class ApiRequestLog(models.Model):
    """Every request the demo business API received: attempts, next to the effects (coupons)."""

    method = models.CharField(max_length=10)
    path = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=200, blank=True)
    status = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.method} {self.path} {self.status}"
