"""Who may read the metrics: a scraper holding METRICS_TOKEN, or (no token set) one on an allowed network.

Shared by the web's `/metrics` (observability/views.py) and the workers' own endpoint
(observability/worker_endpoint.py), so both answer the same scrapers.
"""

import hmac
import ipaddress

from django.conf import settings


def scraper_allowed(*, authorization: str, address: str) -> bool:
    token = settings.METRICS_TOKEN
    if token:
        return hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(client in ipaddress.ip_network(n) for n in settings.METRICS_ALLOWED_NETWORKS)
