"""An agent's configuration versions: every change of its configuration (apply_config,
the admin's form) writes an immutable numbered row with the snapshot as applied, unless
the snapshot equals the latest version's (an unchanged apply writes none)."""

from django.db import transaction

from record.agent_config import agent_config_hash, agent_config_snapshot
from record.models import Agent, AgentVersion


def agent_version_record(*, agent: Agent, actor: str, source: str) -> AgentVersion | None:
    """The new version of `agent` as it is now stored, or None when its configuration is
    the latest version's. A workflow's agent is versioned by its workflow: None.

    The agent's row is locked for the numbering, so two applies at once write 1 and 2,
    never 1 twice."""
    with transaction.atomic():
        row = (
            Agent.objects.select_for_update(of=("self",))
            .select_related("model", "fallback_model", "summary_model", "cheap_model")
            .filter(pk=agent.pk, workflow__isnull=True)
            .first()
        )
        if row is None:
            return None
        snapshot = agent_config_snapshot(row)
        digest = agent_config_hash(snapshot)
        latest = (
            AgentVersion.objects.filter(agent=row)
            .order_by("-number")
            .values_list("number", "config_hash")
            .first()
        )
        if latest is not None and latest[1] == digest:
            return None
        return AgentVersion.objects.create(
            agent=row,
            number=(latest[0] if latest else 0) + 1,
            config=snapshot,
            config_hash=digest,
            actor=actor[:150],
            source=source,
        )
