"""Load the real demo configuration and data, as `make run` does."""

from pathlib import Path

import yaml

from configuration.services import config_apply
from demo.services import demo_data_seed

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "config" / "demo.yaml"
DEMO_REQUEST = (
    "find last week's orders with logistics exceptions, notify each customer, then write a report"
)


def demo_install() -> None:
    config_apply(document=yaml.safe_load(DEMO_CONFIG.read_text()))
    demo_data_seed()
