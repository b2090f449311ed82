import os
import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from pgvector.django import VectorField

from .events import TurnOutcome
from .states import State


class StateField(models.CharField):
    """The session state column; choices come from the pure-Python enum."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("max_length", 20)
        kwargs.setdefault("choices", [(s.value, s.value.replace("_", " ")) for s in State])
        super().__init__(*args, **kwargs)


class ModelApi(models.TextChoices):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    PROMPT_TOOLS = "prompt_tools"
    RULES = "rules"


class TokenizerName(models.TextChoices):
    """How an endpoint's tokens are counted (memory/tokens.py; README "Token counts")."""

    O200K_BASE = "o200k_base", "o200k_base"
    CL100K_BASE = "cl100k_base", "cl100k_base"
    ESTIMATE = "estimate", "estimate (characters a token: tokenizer_ratio)"


class ModelEndpoint(models.Model):
    """A model reachable over one wire protocol. The key lives in the environment."""

    name = models.SlugField(max_length=100, unique=True)
    api = models.CharField(max_length=20, choices=ModelApi.choices)
    base_url = models.URLField(max_length=500, blank=True)
    model = models.CharField(max_length=200, blank=True)
    api_key_env = models.CharField(
        max_length=100, blank=True, help_text="Name of the environment variable holding the key."
    )
    connect_timeout_s = models.FloatField(default=5.0)
    first_token_timeout_s = models.FloatField(default=15.0)
    total_timeout_s = models.FloatField(default=120.0)
    # runtime/retry.py; empty = one attempt (the agent's fallback model is the second try).
    retry = models.JSONField(
        default=dict,
        blank=True,
        help_text='Retry policy, e.g. {"attempts": 3, "backoff_base_s": 1, "backoff_max_s": 10, '
        '"on": ["connect", "5xx", "429"], "retry_after_max_s": 30}; empty = one attempt.',
    )
    price_input_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    price_output_per_1k = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    # Credit points per 1,000 tokens (input + output), charged to the owner's account; 0 = free.
    credits_per_1k_tokens = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        default=0,
        help_text="Credit points per 1,000 tokens (input + output); 0: calls cost no points.",
    )
    context_window = models.PositiveIntegerField(default=128000)
    # Blank: the api's default (memory.tokens.DEFAULT_BY_API).
    tokenizer = models.CharField(
        max_length=20,
        choices=TokenizerName.choices,
        blank=True,
        help_text="How this model's tokens are counted; blank: its api's default (openai "
        "o200k_base; anthropic, prompt_tools o200k_base but at least one token per 3.5 "
        "ASCII characters; rules 4 characters a token).",
    )
    tokenizer_ratio = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.5), MaxValueValidator(10)],
        help_text="With tokenizer 'estimate' only: ASCII characters a token (0.5-10; blank: "
        "3); every other character counts one token.",
    )
    options = models.JSONField(default=dict, blank=True)
    # Per owner, shared by every worker process through Redis (billing/ratelimit.py); 0 = no limit.
    rate_limit_calls_per_min = models.PositiveIntegerField(default=0)
    rate_limit_tokens_per_min = models.PositiveIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [("reset_breaker_modelendpoint", "Can reset a model endpoint's breaker")]

    def __str__(self) -> str:
        return f"{self.name} ({self.api})"

    def clean(self) -> None:
        from runtime.retry import retry_policy_problems

        self.retry = self.retry or {}  # an emptied form field: the defaults
        if problems := retry_policy_problems(self.retry):
            raise ValidationError({"retry": "; ".join(problems)})
        # A ratio is read by an explicit estimate only: next to a BPE tokenizer it would mislead.
        if self.tokenizer_ratio is not None and self.tokenizer != TokenizerName.ESTIMATE:
            raise ValidationError(
                {"tokenizer_ratio": "Only with the tokenizer 'estimate'; leave it blank."}
            )

    @property
    def missing_key_env(self) -> str:
        """The key variable this endpoint names but this process's environment lacks; '' if none."""
        name = self.api_key_env
        return name if name and not os.environ.get(name) else ""


class DoubleTexting(models.TextChoices):
    ENQUEUE = "enqueue", "enqueue (run after the current turn)"
    INTERRUPT = "interrupt", "interrupt (stop the current turn, run the new one)"
    REJECT = "reject", "reject (409 while a turn runs)"


class Agent(models.Model):
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(blank=True)
    model = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="agents")
    fallback_model = models.ForeignKey(
        ModelEndpoint, on_delete=models.PROTECT, null=True, blank=True, related_name="fallback_for"
    )
    # Gradual rollout: this share of sessions (sticky, by a hash of the session
    # id) use the candidate model instead of `model`.
    candidate_model = models.ForeignKey(
        ModelEndpoint,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="candidate_for",
    )
    candidate_percent = models.PositiveSmallIntegerField(default=0, help_text="0-100")
    # What the candidate's latest evaluation must show before candidate_percent may be
    # raised, e.g. {"trajectory_match": ">= 0.9", "cost_ratio": "<= 1.2"} (evaluations/gate.py).
    rollout_gate = models.JSONField(default=dict, blank=True)
    tools = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    max_iterations = models.PositiveSmallIntegerField(default=8, help_text="Tool rounds per turn.")
    # Loop guards (see engine/gates/guards.py) and the three time limits.
    repeat_call_limit = models.PositiveSmallIntegerField(
        default=3,
        help_text="Stop after this many rounds of the same tool call with (nearly) the same arguments.",
    )
    same_result_limit = models.PositiveSmallIntegerField(
        default=2,
        help_text="Stop when a tool's result repeats the previous one this many times in a row.",
    )
    step_timeout_s = models.FloatField(
        default=60.0, help_text="All tool calls of one step must finish within this."
    )
    turn_timeout_s = models.FloatField(
        default=600.0, help_text="After this, the turn gets no more tool rounds."
    )
    context_window = models.PositiveIntegerField(default=128000)
    # Context budget (engine/model/context.py): partition overrides, e.g. {"history": 32000}.
    context_budget = models.JSONField(default=dict, blank=True)
    # Summaries of the oldest history (the 90% watermark); empty = the cheap or fallback model.
    summary_model = models.ForeignKey(
        ModelEndpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Long-term memory (memory/): top_k, tags, extraction on/off.
    memory = models.JSONField(default=dict, blank=True)
    # Dialogue state extraction (memory/dialogue.py): intents and slots with keywords/patterns.
    dialogue = models.JSONField(
        default=dict,
        blank=True,
        help_text='Intents and slots extracted per user turn, e.g. {"intents": [{"name": '
        '"refund", "keywords": ["refund"]}], "slots": [{"name": "order", "patterns": '
        '["(SO-\\d+)"]}]} (see README, "Context layers").',
    )
    rules = models.JSONField(
        default=list, blank=True, help_text="Rules for the offline 'rules' model (see README)."
    )
    double_texting = models.CharField(
        max_length=10,
        choices=DoubleTexting.choices,
        default=DoubleTexting.ENQUEUE,
        help_text="What a message that arrives while a turn runs does.",
    )
    busy_message = models.TextField(
        default="The service is busy right now. Please try again in a moment.", blank=True
    )
    # Degradation level 1 and up (billing/degradation.py): the cheaper tier and a lower output cap.
    cheap_model = models.ForeignKey(
        ModelEndpoint,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="Used from degradation level 1 (defaults to the fallback model).",
    )
    degraded_max_tokens = models.PositiveIntegerField(
        default=512, help_text="Output limit of a model call from degradation level 1."
    )
    # Budgets (billing/budgets.py); empty = no limit. The day is the owner's (BILLING_TIME_ZONE).
    budget_turn_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    budget_turn_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    budget_session_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    budget_session_cost = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True
    )
    budget_day_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Per owner of a session, this agent's tokens a day."
    )
    budget_day_cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # Agents together (DESIGN.md "Agents together, and model routing").
    handoffs = ArrayField(
        models.CharField(max_length=100),
        default=list,
        blank=True,
        help_text="Agents this one may hand the conversation to (a transfer_to_<slug> tool each).",
    )
    max_depth = models.PositiveSmallIntegerField(
        default=2, help_text="How deep its agent.<slug> tools may nest child sessions."
    )
    routing = models.JSONField(
        default=dict,
        blank=True,
        help_text='Simple turns to a smaller model: {"small": endpoint, "when": CEL, '
        '"escalate_on": ["invalid_tool_call", "invalid_json"]} (see README, "Model routing").',
    )
    # The environment layer (engine/gates/surroundings.py): is_peak_hour, in its time zone.
    peak_hours = ArrayField(
        models.CharField(max_length=11),
        default=list,
        blank=True,
        help_text="Busy windows in its time zone, e.g. 09:00-12:00, 14:00-18:00 (22:00-02:00 "
        "runs past midnight); the model sees is_peak_hour, and its flip after a pause is a drift.",
    )
    timezone = models.CharField(
        max_length=64,
        blank=True,
        help_text="IANA zone of its peak hours and of its sessions' time (a session's metadata "
        "timezone wins for the latter), e.g. Asia/Shanghai; blank: BILLING_TIME_ZONE.",
    )
    enabled = models.BooleanField(default=True)
    value = models.FloatField(
        default=1.0,
        help_text="What a session is worth by default: calls competing for points are served highest value per point first.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class AgentVersion(models.Model):
    """One applied configuration of an agent, immutable: written by every change of it
    (apply_config, the admin's form) whose snapshot differs from the latest version's."""

    # No index of its own: agentversion_number leads with it.
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="versions", db_index=False
    )
    number = models.PositiveIntegerField()
    # record/agent_config.py: every versioned field as applied (endpoints by name).
    config = models.JSONField()
    config_hash = models.CharField(max_length=64)
    actor = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=20, help_text="config | admin | backfill")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "number"], name="agentversion_number")
        ]

    def __str__(self) -> str:
        return f"{self.agent.slug}@{self.number}"


class TurnOutcomeChoice(models.TextChoices):
    OK = TurnOutcome.OK.value, "ok"
    TOOL_FAILURES = TurnOutcome.TOOL_FAILURES.value, "tool failures"
    STOPPED = TurnOutcome.STOPPED.value, "stopped"
    ERROR = TurnOutcome.ERROR.value, "error"


class SessionQuerySet(models.QuerySet["Session"]):
    def locked(self) -> "SessionQuerySet":
        """The session rows locked until the transaction ends, the one idiom for it: only
        the session's own row (a joined agent stays free: posts to the agent's other
        sessions and an admin edit of the agent do not wait), FOR NO KEY UPDATE (rows that
        reference the session may still be inserted meanwhile)."""
        return self.select_for_update(of=("self",), no_key=True)


class Session(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of their own: session_agent_created and session_owner_created lead with them.
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, related_name="sessions", db_index=False
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="agent_sessions",
        db_index=False,
    )
    # Dialogue state (intent and slots) extracted per user turn, shown to the model compactly.
    dialogue_state = models.JSONField(default=dict, blank=True)
    role = models.CharField(max_length=50, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # Opened by a stateless OpenAI-compatible request (no X-Session-Id): not counted as a
    # session created, left out of session lists, pruned after EPHEMERAL_SESSION_TTL_S.
    ephemeral = models.BooleanField(default=False)
    state = StateField(default=State.IDLE.value)
    version = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001 - NULL is "no lease"
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    turn = models.PositiveIntegerField(default=0)
    step = models.PositiveIntegerField(
        default=0, help_text="Steps committed over the session's life."
    )
    iteration = models.PositiveSmallIntegerField(
        default=0, help_text="Model calls in the current turn."
    )
    turn_started_at = models.DateTimeField(null=True, blank=True)
    message_seq = models.PositiveIntegerField(default=0)
    event_seq = models.PositiveIntegerField(default=0)
    queued_count = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    cancel_reason = models.CharField(max_length=200, blank=True)
    cancel_actor = models.CharField(max_length=150, blank=True)
    # A durable timer (schedule_followup): the sweeper wakes the session when due.
    timer_due_at = models.DateTimeField(null=True, blank=True)
    timer_note = models.TextField(blank=True)
    # Set by a fork or a resume: the next model step compares the environment
    # with the checkpoint's and tells the model what changed.
    resume_check = models.BooleanField(default=False)
    env_fingerprint = models.CharField(max_length=64, blank=True)
    # The current turn's trace (W3C traceparent) when traces are on: every step of the
    # turn, on any worker, joins it (observability/tracing.py). Empty when off.
    trace_parent = models.CharField(max_length=55, blank=True)
    # Indexed only where set (session_forked_from): most sessions are not forks.
    forked_from = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="forks",
        db_index=False,
    )
    forked_at_step = models.PositiveIntegerField(null=True, blank=True)
    # A workflow run (workflows/): the version it started with and where it stands, in the
    # session row so that each node's step commits its output, the next active nodes and
    # the checkpoint in the one conditional UPDATE every step makes.
    workflow_version = models.ForeignKey(
        "workflows.WorkflowVersion",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="runs",
        db_index=False,
    )
    workflow_state = models.JSONField(null=True, blank=True)
    # A child session: the run of another agent that a call of this session's (an agent
    # node, an `agent.<slug>` tool) started; its finish wakes the parent. One child per
    # call, so a step re-run after a crash finds the child it started.
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="children",
        db_index=False,
    )
    parent_call = models.OneToOneField(
        "ToolCall",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="child_session",
    )
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    value = models.FloatField(
        default=1.0, help_text="Set at creation (default: the agent's value)."
    )
    # The API key that opened the session (a plain id: sessions never import accounts):
    # its model calls' cost is written to the key's spend rollup (billing.SpendDaily) in
    # each step's own batch, and the key's budget is judged from it. Empty: no key.
    api_key_id = models.BigIntegerField(null=True, blank=True)
    # A replay of a recorded turn for evaluations.Evaluation (by id: the record imports no
    # app). Run as the evaluations' own user, so never in a user's usage, credits or
    # rankings; what it replays is in metadata["replay"] (engine/gates/replay.py).
    evaluation_id = models.BigIntegerField(null=True, blank=True)
    # The agent's configuration version (AgentVersion) the current or last turn ran on:
    # stamped by the turn's first step and by a handoff, in the step's own UPDATE
    # (engine/store/commit.py). NULL: a workflow's agent (versioned by its workflow), or
    # a turn older than versions. No index and no constraint: it is only read through the
    # session, and an index would be one more insertion on every step's UPDATE. A version is
    # immutable and goes only with its agent, which its sessions PROTECT: never dangling.
    agent_version = models.ForeignKey(
        AgentVersion,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    degradation_level = models.PositiveSmallIntegerField(
        default=0, help_text="0 normal .. 3 critical tools only, set at each model step."
    )
    last_error = models.TextField(blank=True)
    # How the last turn that ended went (DESIGN.md "A turn's outcome"), written by the step
    # that ends it, from its `turn.finished`: the list filters on it without reading events.
    last_turn_number = models.PositiveIntegerField(null=True, blank=True)
    last_turn_outcome = models.CharField(
        max_length=20, choices=TurnOutcomeChoice.choices, blank=True, db_default="", default=""
    )
    last_turn_calls = models.JSONField(
        null=True, blank=True, help_text="The last ended turn's tool calls by how they ended."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SessionQuerySet.as_manager()

    class Meta:
        # The operator's controls beyond "change session" (cancel, resume): each can make
        # something happen in the world a second time, or speak for the agent.
        permissions = [
            ("fork_session", "Can fork a session from a checkpoint (may repeat side effects)"),
            ("take_over_session", "Can take over a session (reply, finish, hand back)"),
            ("run_tool_session", "Can run a session's tool by hand"),
        ]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="session_owner_created"),
            # The admin's "sessions of this key" (a ranked key's link); most rows have none.
            models.Index(
                fields=["api_key_id", "-created_at"],
                name="session_key_created",
                condition=models.Q(api_key_id__isnull=False),
            ),
            # The pruning of ephemeral sessions reads only them (a small share of sessions).
            models.Index(
                fields=["updated_at"],
                name="session_ephemeral_updated",
                condition=models.Q(ephemeral=True),
            ),
            models.Index(fields=["agent", "-created_at"], name="session_agent_created"),
            # The sweeper's two questions: runs whose lease ran out, and
            # sessions with messages waiting and nobody on them.
            models.Index(
                fields=["lease_expires_at"],
                name="session_runnable_lease",
                condition=Q(state__in=["processing", "tool_wait", "tool_loop"]),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="session_queued_lease",
                condition=Q(queued_count__gt=0),
            ),
            models.Index(fields=["state"], name="session_state"),
            # The admin home's "turns not ok in the last 24 h" (sessions/selectors.py): an
            # index-only scan of the few such sessions, not a pass over all of them.
            models.Index(
                fields=["updated_at"],
                include=["last_turn_outcome"],
                name="session_not_ok_updated",
                condition=Q(
                    last_turn_outcome__in=["error", "stopped", "tool_failures"], ephemeral=False
                ),
            ),
            models.Index(
                fields=["timer_due_at"],
                name="session_timer_due",
                condition=Q(state="waiting_timer"),
            ),
            models.Index(
                fields=["workflow_version", "-created_at"],
                name="session_workflow_runs",
                condition=Q(workflow_version__isnull=False),
            ),
            models.Index(
                fields=["parent", "created_at"],
                name="session_children",
                condition=Q(parent__isnull=False),
            ),
            # An evaluation's replays: a resumed run finds those its dead worker opened.
            models.Index(
                fields=["evaluation_id"],
                name="session_evaluation_replays",
                condition=Q(evaluation_id__isnull=False),
            ),
            models.Index(
                fields=["forked_from"],
                name="session_forked_from",
                condition=Q(forked_from__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return str(self.id)


def _session_key(*, related_name: str) -> "models.ForeignKey[Session, Session]":
    """The session of a row a step writes.

    No index of its own: each such table has an index or unique constraint that
    leads with `session` and serves every lookup by it (and the cascade). A step
    inserts ~10 rows, and every index is one more insertion and WAL record per row.
    """
    return models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name=related_name, db_index=False
    )


class MessageRole(models.TextChoices):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class MessageStatus(models.TextChoices):
    QUEUED = "queued", "queued (waits for its turn)"
    FINAL = "final"


class Message(models.Model):
    session = _session_key(related_name="messages")
    # Assigned when the message enters the history; a user message that waits
    # for a running turn has none yet, so turns never interleave.
    seq = models.PositiveIntegerField(null=True, blank=True)
    turn = models.PositiveIntegerField(default=0)
    role = models.CharField(max_length=10, choices=MessageRole.choices)
    status = models.CharField(
        max_length=10, choices=MessageStatus.choices, default=MessageStatus.FINAL
    )
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    name = models.CharField(max_length=100, blank=True)
    data = models.JSONField(
        null=True, blank=True, help_text="Structured tool result, for tool messages."
    )
    token_count = models.PositiveIntegerField(default=0)
    # The tokenizer (a memory.tokens key; new messages: its DEFAULT_TOKENIZER) that counted
    # token_count: a step counting with another one counts the message again.
    token_counter = models.CharField(max_length=40, default=TokenizerName.O200K_BASE.value)
    # NULL, not "", so the partial unique constraint ignores messages without a key.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # The customer app's extra_context for a user message: data for the model, never instructions.
    extra_context = models.JSONField(null=True, blank=True)
    # A client's settings for the model calls of the turn this message starts or answers
    # (llm.types.ModelOptions: the OpenAI-compatible endpoint's response_format and sampling
    # parameters). Kept with the message so every step of the turn, a re-run after a worker
    # crash included, reads them from the history it already reads.
    turn_options = models.JSONField(null=True, blank=True)
    # Set when a summary replaced this message in the context; archived, never deleted.
    archived_at = models.DateTimeField(null=True, blank=True)
    # For recall over archived messages; any dimension (the embeddings endpoint decides).
    embedding = VectorField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # "view" shows that a message (tool call, event) exists; what it says takes this too.
        permissions = [
            ("view_message_content", "Can view what messages, tool calls and events say")
        ]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="message_session_seq"),
            models.UniqueConstraint(
                fields=["session", "idempotency_key"],
                name="message_session_idempotency",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]
        indexes = [
            models.Index(
                fields=["session", "id"], name="message_queued", condition=Q(status="queued")
            ),
            # Full-text search over what was said (the admin's session search:
            # selectors.sessions_saying), 'simple' so names and codes match as written.
            GinIndex(SearchVector("content", config="simple"), name="message_content_search"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.role}"


class SummaryDraft(models.Model):
    """A summary of a session's oldest history made ahead of need, off the step's critical
    path (engine/phases/after_turn.py): at most one per session, in flight or ready.

    A cache of paid work, not a record: the step that reaches the summary watermark turns
    it into the summary message (engine/model/summaries.py `summary_draft_use`); once a newer
    summary exists (`base_through` no longer matches) it is stale and the next one replaces it.
    """

    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="summary_draft")
    # The summary it extends (its last seq; 0: none) and the messages it covers.
    base_through = models.PositiveIntegerField(default=0)
    from_seq = models.PositiveIntegerField(default=0)
    through_seq = models.PositiveIntegerField(default=0)
    content = models.TextField(blank=True)
    data = models.JSONField(null=True, blank=True)
    token_count = models.PositiveIntegerField(default=0)
    # Set while a task makes it (the claim; a stale claim may be taken over); NULL otherwise.
    claimed_at = models.DateTimeField(null=True, blank=True)
    ready = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.session_id} summary draft {self.from_seq}-{self.through_seq}"


class ToolCallStatus(models.TextChoices):
    EXECUTING = "executing"
    SUCCESS = "success"
    FAILED = "failed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


class Refusal(models.TextChoices):
    """Why a call with status `rejected` did not run (blank: the turn ended before it ran)."""

    REJECTED = "rejected", "rejected by an approver"
    EXPIRED = "expired", "no decision before the deadline"
    UNPAID = "unpaid", "not enough credit points"
    NOT_SENT = "not_sent", "not sent: an evaluation's replay (would have called)"


class ToolCall(models.Model):
    session = _session_key(related_name="tool_calls")
    turn = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    position = models.PositiveSmallIntegerField(default=0)
    call_id = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=100)
    # The arguments the call ran with (an approver's edit, if any: then the model's are in
    # `proposed_input`).
    input = models.JSONField(default=dict, blank=True)
    proposed_input = models.JSONField(
        null=True,
        blank=True,
        help_text="The model's arguments, when an approver edited them (input is what ran).",
    )
    status = models.CharField(
        max_length=10, choices=ToolCallStatus.choices, default=ToolCallStatus.EXECUTING
    )
    refusal = models.CharField(
        max_length=10, choices=Refusal.choices, blank=True, db_default="", default=""
    )
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    elapsed_ms = models.PositiveIntegerField(null=True, blank=True)
    coercions = models.JSONField(
        default=list, blank=True, help_text="Safe argument coercions applied."
    )
    cached = models.BooleanField(
        default=False, help_text="Answered from an identical earlier read-only call."
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    # Set (and committed) just before a side-effecting call is sent: a call
    # found executing with this set after a crash is uncertain and is probed.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # A retry's wait too long to sleep in a worker parked the session: not sent before this.
    retry_at = models.DateTimeField(null=True, blank=True)
    probe_outcome = models.CharField(max_length=20, blank=True)
    # Probes that could not tell so far: each backs off and asks again, up to
    # RECOVERY_PROBE_ATTEMPTS (engine/gates/recovery.py).
    probes = models.PositiveSmallIntegerField(default=0, db_default=0)
    # The call's risk level (declared by its tool or assessed) and why: tools/risk.py.
    risk_level = models.PositiveSmallIntegerField(null=True, blank=True)
    risk_reason = models.CharField(max_length=200, blank=True, db_default="")
    # Unique by a constraint, not `unique=True`, which also builds a LIKE index never used.
    idempotency_key = models.CharField(max_length=200)
    # A tool of the client's (the OpenAI-compatible request's `tools`): never run here; the
    # turn waits (paused_for_user) until the client posts its result.
    client = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["idempotency_key"], name="toolcall_idempotency_key")
        ]
        indexes = [
            models.Index(fields=["session", "turn", "position"], name="toolcall_session_turn"),
            models.Index(
                fields=["session"], name="toolcall_executing", condition=Q(status="executing")
            ),
            # A tool's recent failure rate (risk assessment) reads its latest calls.
            models.Index(fields=["tool_name", "-id"], name="toolcall_tool_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name}({self.call_id})"


class Transition(models.Model):
    session = _session_key(related_name="transitions")
    from_state = StateField()
    to_state = StateField()
    trigger = models.CharField(max_length=30)
    reason = models.TextField(blank=True)
    version = models.PositiveIntegerField(help_text="Session version this move produced.")
    turn = models.PositiveIntegerField(default=0)
    actor = models.CharField(max_length=150, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["session", "id"], name="transition_session")]

    def __str__(self) -> str:
        return f"{self.from_state} -> {self.to_state} ({self.trigger})"


class Checkpoint(models.Model):
    session = _session_key(related_name="checkpoints")
    step = models.PositiveIntegerField()
    turn = models.PositiveIntegerField()
    state = StateField()
    message_seq = models.PositiveIntegerField()
    # What changed in this step, not the whole history again (DESIGN.md).
    context = models.JSONField(default=dict)
    # Hash of the environment the step ran in (agent config, tools, model).
    fingerprint = models.CharField(max_length=64, blank=True)
    size_bytes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "step"], name="checkpoint_session_step")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}@{self.step}"


class Event(models.Model):
    session = _session_key(related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=40)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="event_session_seq")]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.type}"


class ModelCallOutcome(models.TextChoices):
    SUCCESS = "success"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    RATE_LIMITED = "rate_limited"
    BAD_REQUEST = "bad_request"
    PROTOCOL_ERROR = "protocol_error"
    TOO_LARGE = "too_large"
    BREAKER_OPEN = "breaker_open"
    CANCELLED = "cancelled"
    FAILED = "failed"


class ModelCall(models.Model):
    """One request to a model endpoint (or one refused before sending), with usage and cost."""

    session = _session_key(related_name="model_calls")
    turn = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    endpoint = models.ForeignKey(
        ModelEndpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="calls"
    )
    endpoint_name = models.CharField(max_length=100)
    api = models.CharField(max_length=20)
    model = models.CharField(max_length=200, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    tokens_estimated = models.BooleanField(default=False)
    first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    total_ms = models.PositiveIntegerField(default=0)
    retried = models.BooleanField(
        default=False, help_text="This call was the retry after a failure."
    )
    fallback_used = models.BooleanField(default=False)
    rollout = models.BooleanField(default=False, help_text="Routed to the agent's candidate model.")
    outcome = models.CharField(max_length=20, choices=ModelCallOutcome.choices)
    error = models.TextField(blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    # "step" answers the session; "summary" condensed its oldest history (engine/model/summaries.py);
    # "extraction" listed what a finished turn is worth remembering (engine/gates/memory.py).
    purpose = models.CharField(max_length=20, default="step", db_default="step")
    # Model routing: the tier that served the call ("main" or "small") and why.
    tier = models.CharField(max_length=10, default="main", db_default="main")
    tier_reason = models.CharField(max_length=200, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["session", "turn"], name="modelcall_session_turn"),
            models.Index(
                fields=["endpoint_name", "-created_at"], name="modelcall_endpoint_created"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_name} {self.outcome}"


class WorkerHealth(models.Model):
    """No table: the admin's Workers page, whose rows are the workers' heartbeats in
    Redis (runtime/health.py). A model only so the page has a place, a name and a
    view permission in the admin."""

    class Meta:
        managed = False
        verbose_name = "worker"
        verbose_name_plural = "workers"
        default_permissions = ("view",)

    def __str__(self) -> str:
        return "worker"


class RequestKey(models.Model):
    """A retried request's memory (DESIGN.md "Requests that may be retried"): what the first
    request that carried this owner's key did, so a retry with the same key returns it
    instead of running again. `fingerprint` is the hash of what the request asked (method,
    path, body); a REST request keeps its response, an OpenAI-compatible one points at the
    turn it posted (a retry re-attaches to it, running or done). Kept IDEMPOTENCY_KEY_TTL_S."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64)
    # The turn an OpenAI-compatible request posted: its session, the session's last event and
    # token totals before it (relay.TurnAnswer reads the turn's events from there).
    # No constraint and no cascade: pruning a session must not scan this table (a record
    # whose session is gone is a turn that cannot be re-attached: the retry runs anew).
    session = models.ForeignKey(
        Session,
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    after_seq = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    # A REST request's response, returned as it was to a retry.
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    # Requests that used the record: a client gone from one is not cancelled while a later
    # one (its retry) waits on the same turn.
    attempts = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "key"], name="requestkey_owner_key")
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}:{self.key}"
