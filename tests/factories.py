import factory
from django.contrib.auth import get_user_model

from accounts.services import api_key_create
from sessions.models import Agent, ModelEndpoint, Session
from tools.models import Tool


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


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
