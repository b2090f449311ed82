"""The demo business's data, for looking at what the demo agent did."""

from django.contrib import admin

from .models import Customer, Notification, Order, Report


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "email")
    search_fields = ("name", "email")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = (
        "number",
        "customer",
        "placed_at",
        "amount",
        "logistics_status",
        "exception_reason",
    )
    list_filter = ("logistics_status",)
    list_select_related = ("customer",)
    search_fields = ("number", "customer__name", "customer__email")
    date_hierarchy = "placed_at"


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "order", "message", "created_at")
    list_select_related = ("customer", "order")
    search_fields = ("message", "customer__name", "order__number", "idempotency_key")
    readonly_fields = ("created_at",)


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "created_at")
    search_fields = ("title", "body")
    readonly_fields = ("created_at",)
