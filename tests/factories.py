from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from accounts.services import api_key_create
from billing.models import SpendDaily, UsageDaily
from evaluations.models import Evaluation
from record.models import Agent, ModelEndpoint, Session
from tools.models import Tool


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


def permissions(*names: str) -> list[Permission]:
    """Permissions by "app_label.codename" (each must exist)."""
    found = []
    for name in names:
        app_label, codename = name.split(".", 1)
        found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return found


class StaffUserFactory(UserFactory):
    """A staff user (not a superuser) holding the permissions named in `perms`
    ("app_label.codename"), e.g. StaffUserFactory(perms=["memory.view_memoryitem"])."""

    class Meta:
        skip_postgeneration_save = True

    is_staff = True

    @factory.post_generation
    def perms(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        if create and extracted:
            self.user_permissions.add(*permissions(*extracted))


class ModelEndpointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ModelEndpoint
        django_get_or_create = ("name",)

    name = "rules"
    api = "rules"


class ToolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tool
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"tool_{n}")
    description = "A test tool."
    kind = "python"
    handler = "builtin.current_time"
    parameters = factory.LazyFunction(
        lambda: {"type": "object", "properties": {}, "additionalProperties": False}
    )


class AgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Agent
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"agent-{n}")
    system_prompt = "You are a test agent."
    model = factory.SubFactory(ModelEndpointFactory)
    rules = factory.LazyFunction(lambda: [{"answer": "Echo: {{ user }}"}])


class SessionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Session

    agent = factory.SubFactory(AgentFactory)
    owner = factory.SubFactory(UserFactory)
    role = "support"


def api_key_for(username: str, roles: tuple[str, ...] = ("support",)) -> str:
    return api_key_create(username=username, roles=list(roles)).raw


class UsageDailyFactory(factory.django.DjangoModelFactory):
    """A rollup row as the steps write it (one shard of an owner's agent and day)."""

    class Meta:
        model = UsageDaily

    owner = factory.SubFactory(UserFactory)
    agent = factory.SubFactory(AgentFactory)
    model_calls = 1


class SpendDailyFactory(factory.django.DjangoModelFactory):
    """A spend rollup row (per day, owner, agent, endpoint and key)."""

    class Meta:
        model = SpendDaily

    owner = factory.SubFactory(UserFactory)
    agent_id = factory.LazyAttribute(lambda _: AgentFactory().pk)
    endpoint = "rules"
    model_calls = 1


class EvaluationFactory(factory.django.DjangoModelFactory):
    """A finished evaluation with the totals given (the rollout gate reads them)."""

    class Meta:
        model = Evaluation

    owner = factory.SubFactory(UserFactory)
    actor = "api:test"
    agent = factory.SubFactory(AgentFactory)
    candidate = factory.LazyFunction(lambda: {"model": "candidate"})
    state = "finished"
    finished_at = factory.LazyFunction(timezone.now)
    totals = factory.LazyFunction(
        lambda: {"turns": 10, "trajectory_match": 1.0, "cost_ratio": 1.0, "would_have_called": 0}
    )
