"""Settings, every one from the environment (or `.env`); see `.env.example`."""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)
# The embedded stack (`python -m devstack`) writes the URLs it started here.
environ.Env.read_env(BASE_DIR / ".data" / "stack.env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="dev-insecure-change-me-" + "x" * 40)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Browser origins allowed to open websockets; clients that send no Origin
# (servers, CLIs) authenticate by key alone.
WS_ALLOWED_ORIGINS = env.list(
    "WS_ALLOWED_ORIGINS",
    default=["http://127.0.0.1:8000", "http://localhost:8000"],
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    # Swagger UI and Redoc as static files: the docs work without internet.
    "drf_spectacular_sidecar",
    "channels",
    "accounts",
    "record.apps.RecordConfig",
    "sessions.apps.SessionsConfig",
    "configuration",
    "tools",
    "memory",
    "billing",
    "approvals",
    "workflows",
    "evaluations",
    "demo",
    "observability",
    "audit",
    "hooks",
]

MIDDLEWARE = [
    # First: a response whose status is decided on the loop settles there, after every
    # other middleware saw it (runtime/deferred_response.py).
    "runtime.deferred_response.DeferredResponseMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The REST request's span (a turn's trace starts there); not even loaded when traces are off.
    "observability.middleware.TraceRequestMiddleware",
    # daphne serves no static files; WhiteNoise serves the admin's CSS and JS.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # A NUL in a query parameter is a 400 before any view filters on it.
    "restapi.middleware.RejectNulInQueryMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "agentplatform.urls"
ASGI_APPLICATION = "agentplatform.asgi.application"
WSGI_APPLICATION = "agentplatform.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default="postgresql://postgres@127.0.0.1:5432/agentplatform")
}
DATABASES["default"]["CONN_MAX_AGE"] = 0
# Each test run may name its own test database, so parallel runs never share one.
if env.str("TEST_DATABASE_NAME", default=""):
    DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME")}
DATABASES["default"].setdefault("OPTIONS", {})
if env.bool("DB_POOL", default=True):
    # psycopg's pool: the worker's many threads borrow a connection only
    # while they touch the database, never across a model or tool call.
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": env.int("DB_POOL_MIN", default=2),
        "max_size": env.int("DB_POOL_MAX", default=20),
        "timeout": env.float("DB_POOL_TIMEOUT", default=30.0),
    }
# A step's batch prepared on the server once per connection (record/rows.py);
# off behind a pooler that does not keep sessions (PgBouncer transaction mode).
DB_PREPARED_STATEMENTS = env.bool("DB_PREPARED_STATEMENTS", default=True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Namespaces the platform's own Redis keys (breakers, cancel signals), so two
# deployments or test runs can share one Redis.
REDIS_KEY_PREFIX = env.str("REDIS_KEY_PREFIX", default="agentplatform")

# HTTP requests one web process runs at once (agentplatform/request_gate.py); the
# rest wait on its loop. Below DB_POOL_MAX, so a running request never waits for
# a connection; 0 = no gate.
WEB_MAX_CONCURRENT_REQUESTS = env.int("WEB_MAX_CONCURRENT_REQUESTS", default=16)

CHANNEL_LAYERS = {
    "default": {
        # The Pub/Sub layer held 2,000 idle sockets where the list-based one
        # failed at 1-2k (DESIGN.md); socket_timeout=None keeps idle
        # subscriptions from being dropped every few seconds by redis-py 8.
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
            # Group names hold database ids (a key's group): two deployments or
            # bench runs sharing one Redis need prefixes of their own.
            "prefix": env.str("CHANNEL_LAYER_PREFIX", default="asgi"),
        },
    }
}

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_QUEUE", default="agentplatform")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    # One Redis list per priority (`<queue>\x06\x16<n>`, 0 taken first): session runs
    # are sent with a priority from the session's value (record/dispatch.py).
    "priority_steps": list(range(10)),
    "queue_order_strategy": "priority",
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
SWEEPER_INTERVAL_S = env.float("SWEEPER_INTERVAL_S", default=0.5)
# /readyz is unready when no sweep completed for this long (beat or the sweeper
# is down). Generous by default: a sweep queues behind runs on a busy worker.
SWEEPER_STALE_S = env.float("SWEEPER_STALE_S", default=max(10 * SWEEPER_INTERVAL_S, 30.0))
# Beat keeps its schedule in memory unless a file is named: a deployment need
# not have a writable checkout, and the schedule is rebuilt from settings anyway
# (the only cost is that the hourly pruning counts its hour from beat's start).
CELERY_BEAT_SCHEDULE_FILENAME = env.str("CELERY_BEAT_SCHEDULE_FILENAME", default="")
CELERY_BEAT_SCHEDULER = (
    "celery.beat:PersistentScheduler" if CELERY_BEAT_SCHEDULE_FILENAME else "celery.beat:Scheduler"
)
CELERY_BEAT_SCHEDULE = {
    "sweep-sessions": {
        "task": "sessions.tasks.sweep_sessions",
        "schedule": SWEEPER_INTERVAL_S,
        "options": {"expires": max(SWEEPER_INTERVAL_S * 5, 5)},
    },
    "prune-checkpoints": {
        "task": "sessions.tasks.prune_checkpoints",
        "schedule": 3600.0,
    },
    "prune-ephemeral-sessions": {
        "task": "sessions.tasks.prune_ephemeral_sessions",
        "schedule": 600.0,
    },
    "prune-request-keys": {
        "task": "sessions.tasks.prune_request_keys",
        "schedule": 3600.0,
    },
    # Schedules and run webhooks (hooks/): due schedules fire, due deliveries are sent.
    "fire-schedules": {
        "task": "hooks.tasks.schedules_fire",
        "schedule": env.float("SCHEDULES_TICK_S", default=5.0),
        "options": {"expires": 30},
    },
    "send-run-webhooks": {
        "task": "hooks.tasks.webhooks_sweep",
        "schedule": env.float("RUN_WEBHOOK_SWEEP_S", default=5.0),
        "options": {"expires": 30},
    },
    # Evaluations whose worker died (lease lapsed) or whose task was lost: sent again.
    "resume-evaluations": {
        "task": "evaluations.tasks.evaluations_sweep",
        "schedule": env.float("EVALUATIONS_SWEEP_S", default=5.0),
        "options": {"expires": 30},
    },
}
# An evaluation's lease (evaluations/lease.py): renewed every third of it while a worker
# runs it; a dead worker's evaluation is resumed by another about this long after.
EVALUATION_LEASE_S = env.float("EVALUATION_LEASE_S", default=30.0)

# Engine limits and timings.
# Approvals (approvals/): an optional webhook told of every requested and resolved
# approval, signed with HMAC-SHA256 when a secret is set; retried with backoff.
APPROVAL_WEBHOOK_URL = env.str("APPROVAL_WEBHOOK_URL", default="")
APPROVAL_WEBHOOK_SECRET = env.str("APPROVAL_WEBHOOK_SECRET", default="")
APPROVAL_WEBHOOK_RETRIES = env.int("APPROVAL_WEBHOOK_RETRIES", default=8)
APPROVAL_WEBHOOK_TIMEOUT_S = env.float("APPROVAL_WEBHOOK_TIMEOUT_S", default=10.0)
# Four eyes: no one decides an approval of a session they own (superusers included);
# false lets the session's owner decide it too, if they are an approver.
APPROVAL_FOUR_EYES = env.bool("APPROVAL_FOUR_EYES", default=True)
# A person's decision may be undone (withdrawn or changed) for this many seconds before the
# run goes on: the run's continuation is scheduled after the window (0: at once).
APPROVAL_UNDO_S = env.float("APPROVAL_UNDO_S", default=10.0)
# Open approvers' websockets (/ws/approvals/) per API key; 0 switches the limit off.
APPROVAL_WS_MAX_SOCKETS_PER_KEY = env.int("APPROVAL_WS_MAX_SOCKETS_PER_KEY", default=20)

# Credits (billing/): an owner without a credit account is not metered unless
# CREDITS_REQUIRED; a call whose points are held by in-flight calls waits for
# them up to CREDITS_WAIT_S; daily caps and usage days follow BILLING_TIME_ZONE.
CREDITS_REQUIRED = env.bool("CREDITS_REQUIRED", default=False)
CREDITS_WAIT_S = env.float("CREDITS_WAIT_S", default=10.0)
CREDITS_WAIT_RETRY_S = env.float("CREDITS_WAIT_RETRY_S", default=0.5)
# Child sessions (engine/gates/children.py): how long a parent waiting on its children is
# left alone before the sweeper looks again (a child's end wakes it at once; this only
# covers a lost wake-up). How deep they nest is each agent's `max_depth`.
CHILDREN_RECHECK_S = env.float("CHILDREN_RECHECK_S", default=300.0)
BILLING_TIME_ZONE = env.str("BILLING_TIME_ZONE", default="UTC")
# Cost notices (billing/notices.py): a budget of a day or a month reaching one of these
# percentages of its limit, or a balance under its low-water mark, shows a banner on every
# admin page and is POSTed to COST_NOTICE_WEBHOOK_URL (signed like the approvals webhook
# when COST_NOTICE_WEBHOOK_SECRET is set), once per threshold and period.
COST_NOTICE_THRESHOLDS = env.list("COST_NOTICE_THRESHOLDS", cast=int, default=[80, 100])
COST_NOTICE_WEBHOOK_URL = env.str("COST_NOTICE_WEBHOOK_URL", default="")
COST_NOTICE_WEBHOOK_SECRET = env.str("COST_NOTICE_WEBHOOK_SECRET", default="")
COST_NOTICE_WEBHOOK_RETRIES = env.int("COST_NOTICE_WEBHOOK_RETRIES", default=8)
COST_NOTICE_WEBHOOK_TIMEOUT_S = env.float("COST_NOTICE_WEBHOOK_TIMEOUT_S", default=10.0)

# Run webhooks (hooks/, docs/schedules-and-webhooks.md): a session, a message or a workflow
# run's `webhook: {url}` is POSTed the turn's outcome when it ends, signed with HMAC-SHA256 in
# X-Run-Signature when RUN_WEBHOOK_SECRET is set; retried with backoff (1 s doubling, at most
# RUN_WEBHOOK_BACKOFF_MAX_S) up to RUN_WEBHOOK_RETRIES times.
RUN_WEBHOOK_SECRET = env.str("RUN_WEBHOOK_SECRET", default="")
RUN_WEBHOOK_TIMEOUT_S = env.float("RUN_WEBHOOK_TIMEOUT_S", default=10.0)
RUN_WEBHOOK_RETRIES = env.int("RUN_WEBHOOK_RETRIES", default=10)
RUN_WEBHOOK_BACKOFF_MAX_S = env.float("RUN_WEBHOOK_BACKOFF_MAX_S", default=600.0)

# Egress (runtime/egress.py, docs/security.md "Egress"): outbound calls (HTTP tools, MCP,
# webhooks, model and embeddings endpoints) never connect to loopback, private, link-local,
# metadata or reserved addresses unless listed here: host names (`api.internal`,
# `*.corp.example`) and address ranges (`10.2.0.0/16`, `127.0.0.1`). Empty: none allowed.
# `make run` passes 127.0.0.1 for its demo API.
EGRESS_ALLOW = env.list("EGRESS_ALLOW", default=[])

# Short leases, renewed by a heartbeat while a run is in flight, let a crashed
# worker's sessions be taken over within ~3 s (lease + one sweeper period).
SESSION_LEASE_S = env.float("SESSION_LEASE_S", default=2.0)
# How long a freshly enqueued run may wait for a worker before the sweeper
# assumes its broker message was lost and enqueues it again.
SESSION_PICKUP_GRACE_S = env.float("SESSION_PICKUP_GRACE_S", default=10.0)
MAX_MESSAGE_CHARS = env.int("MAX_MESSAGE_CHARS", default=32000)
# Bounds on caller JSON (record/json_limits.py): nesting of any body, frame or
# metadata, and the compact UTF-8 size of a session's metadata.
JSON_MAX_DEPTH = env.int("JSON_MAX_DEPTH", default=32)
METADATA_MAX_BYTES = env.int("METADATA_MAX_BYTES", default=16384)
# A message's extra_context (data for the model from the customer app): an object of at
# most this compact UTF-8 size (413 beyond) and nesting depth (400 beyond).
EXTRA_CONTEXT_MAX_BYTES = env.int("EXTRA_CONTEXT_MAX_BYTES", default=8192)
EXTRA_CONTEXT_MAX_DEPTH = env.int("EXTRA_CONTEXT_MAX_DEPTH", default=8)
# A larger request body is refused with 413 before it is parsed (Django's setting).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=2621440)
# Size limits (README "Size limits"). A tool result (its compact UTF-8 JSON) beyond
# TOOL_RESULT_MAX_BYTES is cut with a marker before it is stored or shown to the model;
# an HTTP tool's body is read no further than that plus a little.
TOOL_RESULT_MAX_BYTES = env.int("TOOL_RESULT_MAX_BYTES", default=262144)
# One event's frame on the websocket and row in GET .../events/: daphne (autobahn) refuses
# to send a websocket message over 1 MiB, so this must stay at or under that.
EVENT_MAX_BYTES = env.int("EVENT_MAX_BYTES", default=1048576)
# One page of GET .../events/ (and one read of the websocket's replay): events up to this
# many bytes of payload, and always at least one.
EVENTS_PAGE_MAX_BYTES = env.int("EVENTS_PAGE_MAX_BYTES", default=1048576)
# Memory search (memory/selectors.py): an owner with at most this many live items of a
# dimension is scanned exactly; a larger one gets its own HNSW index (bench/README.md section 14).
MEMORY_EXACT_SCAN_MAX = env.int("MEMORY_EXACT_SCAN_MAX", default=5000)
# HNSW candidate list of a large owner's search (recall@10 1.00 at 50,000 embedding-like items).
MEMORY_HNSW_EF_SEARCH = env.int("MEMORY_HNSW_EF_SEARCH", default=100)
# Memory of the owner-index build (a Celery task, CREATE INDEX CONCURRENTLY).
MEMORY_INDEX_BUILD_MEM = env.str("MEMORY_INDEX_BUILD_MEM", default="512MB")
# A run that continues after this long a pause is told what changed in its environment
# (and runs the business prechecks of calls decided before it).
ENV_CHECK_PAUSE_S = env.float("ENV_CHECK_PAUSE_S", default=600.0)
# How far the situation must have moved for that note (engine/model/environment.py WEIGHTS:
# a change of the agent, a tool or the model weighs 1, a dialogue slot or a degraded
# service 0.5, a degradation level 0.5, 25 points of a budget's share 0.5).
ENV_DRIFT_THRESHOLD = env.float("ENV_DRIFT_THRESHOLD", default=1.0)
# The host under pressure (a drift when it starts or ends, 0 = not checked): the 1-minute
# load average per core at or above ENV_HOST_CPU_HIGH, available memory under
# ENV_HOST_MEM_LOW_MB.
ENV_HOST_CPU_HIGH = env.float("ENV_HOST_CPU_HIGH", default=2.0)
ENV_HOST_MEM_LOW_MB = env.int("ENV_HOST_MEM_LOW_MB", default=256)
# Tools' recent success rate and p50 latency (their latest calls) and quota use are read
# at most this often per process; a rate under a tool's declared sla_rate counts once
# this many of those calls finished.
ENV_TOOL_STATS_TTL_S = env.float("ENV_TOOL_STATS_TTL_S", default=30.0)
ENV_SLA_MIN_CALLS = env.int("ENV_SLA_MIN_CALLS", default=5)
# The environment layer's clock (its time, is_peak_hour) runs this many seconds ahead of
# the host's: to rehearse peak hours in staging. 0 in production.
ENV_CLOCK_SHIFT_S = env.float("ENV_CLOCK_SHIFT_S", default=0.0)
# An uncertain call's probe that cannot tell is asked again this many times in all,
# RECOVERY_PROBE_BACKOFF_S, then twice that, ... apart (a durable wait, no worker held).
RECOVERY_PROBE_ATTEMPTS = env.int("RECOVERY_PROBE_ATTEMPTS", default=3)
RECOVERY_PROBE_BACKOFF_S = env.float("RECOVERY_PROBE_BACKOFF_S", default=5.0)
# Checkpoints of finished turns older than this are pruned (the latest per session is kept).
CHECKPOINT_RETENTION_DAYS = env.float("CHECKPOINT_RETENTION_DAYS", default=30.0)
# Sessions of stateless OpenAI-compatible requests (no X-Session-Id) are deleted, with
# everything they hold, once idle this long (checked every 10 minutes).
EPHEMERAL_SESSION_TTL_S = env.float("EPHEMERAL_SESSION_TTL_S", default=86400.0)
# An idle websocket re-reads the database this often, in case a notification was lost.
WS_RESYNC_S = env.float("WS_RESYNC_S", default=15.0)
# A session's websocket feed (one channel-layer subscription per session per web
# process) whose receive loop failed joins again after this; its sockets then re-read
# the database.
FEED_RESTART_S = env.float("FEED_RESTART_S", default=1.0)
DELTA_FLUSH_MS = env.int("DELTA_FLUSH_MS", default=50)
# The OpenAI-compatible endpoint waits for a turn at most its agent's turn_timeout_s + 30 s,
# and never longer than this; then it answers with what it has (finish_reason "length").
OPENAI_MAX_WAIT_S = env.float("OPENAI_MAX_WAIT_S", default=600.0)
# Retried requests (docs/api.md "Retried requests"): an Idempotency-Key's first request is
# remembered this long; an OpenAI-compatible client gone before its turn ended cancels the
# turn only if no retry re-attached to it within IDEMPOTENCY_RETRY_GRACE_S (a client that
# may retry: one that sent a key, or the openai SDK, which retries a timeout at once).
IDEMPOTENCY_KEY_TTL_S = env.float("IDEMPOTENCY_KEY_TTL_S", default=86400.0)
IDEMPOTENCY_RETRY_GRACE_S = env.float("IDEMPOTENCY_RETRY_GRACE_S", default=10.0)
# How long a turn waits for the results of the client's own tool calls (the OpenAI-compatible
# request's `tools`) before the sweeper fails them and the model goes on without them.
OPENAI_CLIENT_TOOLS_WAIT_S = env.float("OPENAI_CLIENT_TOOLS_WAIT_S", default=900.0)
# A model endpoint is skipped for a cool-down after this many consecutive failures.
MODEL_BREAKER_THRESHOLD = env.int("MODEL_BREAKER_THRESHOLD", default=5)
MODEL_BREAKER_COOLDOWN_S = env.float("MODEL_BREAKER_COOLDOWN_S", default=30.0)
# A tool fails fast for a cool-down after this many consecutive failures.
TOOL_BREAKER_THRESHOLD = env.int("TOOL_BREAKER_THRESHOLD", default=5)
TOOL_BREAKER_COOLDOWN_S = env.float("TOOL_BREAKER_COOLDOWN_S", default=30.0)
# A retry's wait (runtime/retry.py) up to this long is slept in the worker; a tool call's
# longer wait parks the session (no worker held) and the run comes back for it.
RETRY_INLINE_WAIT_S = env.float("RETRY_INLINE_WAIT_S", default=2.0)
# A tool header `{env: NAME}` may read only these variables: the worker's
# environment also holds the database URL and every model key.
TOOL_SECRET_ENV_PREFIXES = env.list("TOOL_SECRET_ENV_PREFIXES", default=["TOOL_SECRET_"])
TOOL_SECRET_ENV_ALLOW = env.list("TOOL_SECRET_ENV_ALLOW", default=[])
# The executables a stdio MCP server may start (comma-separated, compared with the
# command's first word as written): what runs on the host is the deployer's decision.
# Empty (the default): no stdio server starts; apply_config and the admin refuse one.
MCP_STDIO_COMMANDS = env.list("MCP_STDIO_COMMANDS", default=[])
# Tool descriptions that do not help the model (tools/descriptions.py): warnings, or with
# this on errors that stop apply_config and the admin form (MCP tools only ever warn).
TOOL_DESCRIPTIONS_STRICT = env.bool("TOOL_DESCRIPTIONS_STRICT", default=False)

# Limits that protect the API itself, shared by every process through Redis
# (README "Limits"); 0 switches a limit off.
# Open websockets per API key; a crashed process's slots lapse after WS_SLOT_TTL_S.
WS_MAX_SOCKETS_PER_KEY = env.int("WS_MAX_SOCKETS_PER_KEY", default=500)
WS_SLOT_TTL_S = env.int("WS_SLOT_TTL_S", default=60)
# Sessions one key may create per window (POST /sessions/ and forks).
SESSION_CREATE_LIMIT = env.int("SESSION_CREATE_LIMIT", default=120)
SESSION_CREATE_WINDOW_S = env.int("SESSION_CREATE_WINDOW_S", default=60)
# Failed authentications per window before 429: per key prefix (wrong keys presented
# with one prefix), and per client address, the higher ceiling that still lets the valid
# keys of others behind the same address work while one client there fails.
AUTH_FAIL_PREFIX_LIMIT = env.int("AUTH_FAIL_PREFIX_LIMIT", default=5)
AUTH_FAIL_LIMIT = env.int("AUTH_FAIL_LIMIT", default=50)
AUTH_FAIL_WINDOW_S = env.int("AUTH_FAIL_WINDOW_S", default=60)
# Proxies in front of the platform that append to X-Forwarded-For; 0 trusts none
# and the socket's peer address is the client's.
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
# An open websocket re-reads its key and session from the database at most this
# often (a revocation through the platform is seen at once, via Redis).
WS_AUTH_RECHECK_S = env.float("WS_AUTH_RECHECK_S", default=2.0)
# Requests per API key per window on every REST endpoint (429 with Retry-After beyond).
API_RATE_LIMIT = env.int("API_RATE_LIMIT", default=600)
API_RATE_WINDOW_S = env.int("API_RATE_WINDOW_S", default=60)

# Budgets, rate limits and degradation (README "Budgets, rate limits and degradation").
# Output tokens a model call is assumed to produce when the budget check estimates it.
BUDGET_OUTPUT_ESTIMATE_TOKENS = env.int("BUDGET_OUTPUT_ESTIMATE_TOKENS", default=512)
# A model call's worst case is held against the owner's day, month and key budgets until
# its step commits; a hold its run never released (a crash) stops counting after this.
BUDGET_HOLD_S = env.float("BUDGET_HOLD_S", default=600.0)
# A rate-limited model call waits this long in the worker at most; a longer wait parks
# the session and re-enqueues it for when the window turns, holding no worker.
RATE_LIMIT_INLINE_WAIT_S = env.float("RATE_LIMIT_INLINE_WAIT_S", default=2.0)
# Degradation levels 1, 2, 3 from the share of a budget spent and from queued runs.
DEGRADE_BUDGET_SHARES = env.list("DEGRADE_BUDGET_SHARES", cast=float, default=[0.8, 0.9, 0.97])
DEGRADE_QUEUE_DEPTHS = env.list("DEGRADE_QUEUE_DEPTHS", cast=float, default=[500, 2000, 10000])
# Degradation level 1, 2, 3 from the share of live workers taking no new runs (worker health).
DEGRADE_WORKER_SHARES = env.list("DEGRADE_WORKER_SHARES", cast=float, default=[0.5, 0.75, 1.0])

# Worker health (README "Worker health"): each worker process publishes a heartbeat to
# Redis every WORKER_HEARTBEAT_S with its runs in flight, step latency, error rate, CPU and
# memory over the last WORKER_HEALTH_WINDOW_S. Past any threshold (0 = off) it stops
# taking new runs (its run-queue consumer is cancelled) until it recovers.
WORKER_HEARTBEAT_S = env.float("WORKER_HEARTBEAT_S", default=2.0)
WORKER_HEALTH_WINDOW_S = env.float("WORKER_HEALTH_WINDOW_S", default=60.0)
WORKER_MAX_INFLIGHT = env.int("WORKER_MAX_INFLIGHT", default=0)
WORKER_MAX_STEP_P95_S = env.float("WORKER_MAX_STEP_P95_S", default=120.0)
WORKER_MAX_ERROR_RATE = env.float("WORKER_MAX_ERROR_RATE", default=0.5)
WORKER_ERROR_RATE_MIN_STEPS = env.int("WORKER_ERROR_RATE_MIN_STEPS", default=20)
# Off by default: a worker process runs one core's worth of steps by design (threads pool,
# one process per core), so a busy healthy worker sits near 100 %.
WORKER_MAX_CPU_PERCENT = env.float("WORKER_MAX_CPU_PERCENT", default=0.0)
WORKER_MAX_RSS_MB = env.float("WORKER_MAX_RSS_MB", default=4096.0)
# A run that reaches a worker taking no new runs (it was prefetched) goes back to the
# queue this much later, for another worker or for this one once it recovered.
WORKER_REQUEUE_DELAY_S = env.float("WORKER_REQUEUE_DELAY_S", default=1.0)
# Step pacing: the sweeper measures the database round trip and reads the workers' model
# p95; past these, runs pause between steps (up to PACING_MAX_DELAY_S; 0 = off).
PACING_DB_SLOW_MS = env.float("PACING_DB_SLOW_MS", default=200.0)
PACING_MODEL_SLOW_S = env.float("PACING_MODEL_SLOW_S", default=30.0)
PACING_MAX_DELAY_S = env.float("PACING_MAX_DELAY_S", default=2.0)

# Fast paths that reach past a library's public API (runtime/fastpaths/): off, each falls
# back to the public API (slower, same behaviour). Each is also off by itself on a library
# version it was not written for (a warning, runtime.W001 in `manage.py check`).
FAST_PATHS = env.bool("FAST_PATHS", default=True)

# daphne: freeze the start-up heap out of the garbage collector (agentplatform/gc_tuning.py),
# set the youngest generation's threshold (0 keeps Python's 700), log full collections' pauses.
GC_FREEZE = env.bool("GC_FREEZE", default=True)
GC_THRESHOLD0 = env.int("GC_THRESHOLD0", default=50_000)
GC_LOG_PAUSES = env.bool("GC_LOG_PAUSES", default=False)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
# One date format in every admin page (agentplatform/formats/en/formats.py).
FORMAT_MODULE_PATH = ["agentplatform.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Set it where `collectstatic` should write (production); unset, WhiteNoise serves from the apps.
STATIC_ROOT = env.str("STATIC_ROOT", default="") or None
# Serve app static straight from the finders, so no collectstatic is needed.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=True)
WHITENOISE_AUTOREFRESH = env.bool("WHITENOISE_AUTOREFRESH", default=DEBUG)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["accounts.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["accounts.throttling.ApiKeyRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "restapi.schema.ErrorDocumentingAutoSchema",
    "DEFAULT_PARSER_CLASSES": ["restapi.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "restapi.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent platform API",
    # The overview (auth, errors, paging, the websocket page) is restapi/docs.py's, set by its hook.
    "DESCRIPTION": "Durable, observable agent runs: sessions, messages, events.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Operations grouped by resource (the path's first part after /api/v1), in this order.
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "TAGS": [
        {"name": "sessions", "description": "Conversations with an agent: messages, events, runs."},
        {"name": "agents", "description": "The agents a session can be opened on."},
        {"name": "workflows", "description": "Fixed processes that run as a session."},
        {
            "name": "approvals",
            "description": "Approvers decide the tool calls that wait for a person.",
        },
        {"name": "tools", "description": "The tools your key's roles may use."},
        {"name": "usage", "description": "Your credits, tokens and cost."},
        {
            "name": "openai",
            "description": "OpenAI-compatible endpoint: any OpenAI client talks to an agent.",
        },
    ],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "restapi.docs.overview_hook",
    ],
    # Served by WhiteNoise from drf-spectacular-sidecar, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Production hardening, switched on by environment (see README "Deployment").
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https")
    if env.bool("TRUST_X_FORWARDED_PROTO", default=False)
    else None
)

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
# json: one JSON object per line with session, turn, step and trace ids (observability/logs.py);
# plain: the old one-line text. Both are scrubbed of keys, emails and card numbers.
LOG_FORMAT = env.str("LOG_FORMAT", default="json")

# Observability (README "Observability"). Traces follow the standard OTEL_* variables.
# The admin timeline links a turn's trace id through this template, e.g.
# http://jaeger:16686/trace/{trace_id}; empty shows the id without a link.
TRACE_URL_TEMPLATE = env.str("TRACE_URL_TEMPLATE", default="")
# /metrics: a bearer token, or (unset) only these client networks.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=["127.0.0.0/8", "::1/128"])
# A worker's own /metrics (observability/worker_endpoint.py), for worker hosts without a web
# process; every worker process of a host binds this port (0 = off, as under `make run`,
# where the web's /metrics already sums the workers of its machine).
WORKER_METRICS_PORT = env.int("WORKER_METRICS_PORT", default=0)
WORKER_METRICS_BIND = env.str("WORKER_METRICS_BIND", default="0.0.0.0")  # nosec B104 - a host's scrape port
# Gauges read at scrape time from the apps that own the rows (observability/collector.py).
METRICS_SOURCES = [
    "sessions.selectors.sessions_gauges",
    "approvals.selectors.approvals_pending_gauges",
    "billing.selectors.credits_reserved_gauges",
]
# The share of model calls whose full prompt and answer go to the sampled store (0-1).
PROMPT_SAMPLE_RATE = env.float("PROMPT_SAMPLE_RATE", default=0.01)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {
            "()": "observability.logs.ScrubbingFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "observability.logs.JsonFormatter"},
    },
    "filters": {
        # API keys in `?token=` / `?key=` never reach a log (agentplatform/access_log.py).
        "redact_keys": {"()": "agentplatform.access_log.RedactQueryFilter"},
        # Celery logs every sweep (every SWEEPER_INTERVAL_S) at INFO three times
        # over: sent by beat, received and succeeded on the worker. Those go to DEBUG.
        "quiet_sweeps": {"()": "agentplatform.logfilters.QuietPeriodicTasks"},
        "refusals_without_traceback": {"()": "agentplatform.logfilters.RefusalsWithoutTraceback"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.channels.server": {"filters": ["redact_keys"]},
        "django.server": {"level": "WARNING"},
        # A 4xx is logged as one line (agentplatform/logfilters.py).
        "django.request": {"filters": ["refusals_without_traceback"]},
        "django.security": {"filters": ["refusals_without_traceback"]},
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},  # the mcp SDK's HTTP client
        "celery.beat": {"filters": ["quiet_sweeps"]},
        "celery.worker.strategy": {"filters": ["quiet_sweeps"]},
        "celery.app.trace": {"filters": ["quiet_sweeps"]},
        # A sweep that waited past its expiry while no worker ran is discarded, noisily.
        "celery.worker.request": {"filters": ["quiet_sweeps"]},
    },
}

# Limits on definitions and expressions (docs/security.md "Limits on definitions and
# expressions"). A CEL evaluation's cost is bounded before it runs (workflows/cel_cost.py):
# one unit is about one evaluator step, at most ~0.7 µs here, so the default keeps one
# evaluation under ~50 ms of CPU (cel holds the GIL: the worker's lease heartbeat waits on it).
EXPRESSION_COST_LIMIT = env.int("EXPRESSION_COST_LIMIT", default=60_000)
# Comprehensions (map, filter, all, exists...) nested deeper than this are refused when a
# definition is read: their cost grows as the input's length to that power.
EXPRESSION_MAX_NESTING = env.int("EXPRESSION_MAX_NESTING", default=2)
# YAML definitions (configuration files, the workflow admin editor): at most this many bytes,
# and at most this many values once aliases (`*name`) are expanded, so a few lines cannot
# expand into gigabytes (configuration/documents.py).
DEFINITION_MAX_BYTES = env.int("DEFINITION_MAX_BYTES", default=1_048_576)
DEFINITION_MAX_VALUES = env.int("DEFINITION_MAX_VALUES", default=100_000)
WORKFLOW_MAX_NODES = env.int("WORKFLOW_MAX_NODES", default=500)
WORKFLOW_MAX_VISITS = env.int("WORKFLOW_MAX_VISITS", default=1000)
WORKFLOW_MAX_BRANCHES = env.int("WORKFLOW_MAX_BRANCHES", default=32)
WORKFLOW_MAX_MAP_CONCURRENCY = env.int("WORKFLOW_MAX_MAP_CONCURRENCY", default=50)
# A map node whose `over` list is longer than this fails (expression_limit) at run time.
WORKFLOW_MAP_MAX_ITEMS = env.int("WORKFLOW_MAP_MAX_ITEMS", default=1000)
# Sub-agents (agent.* tools): at most this many started by one step of a session, and at most
# this many sessions created in one run's tree (children, grandchildren...); past either the
# model gets a tool error (`too_many_children`, `too_many_sessions`) it can act on.
AGENT_MAX_CHILDREN_PER_STEP = env.int("AGENT_MAX_CHILDREN_PER_STEP", default=8)
AGENT_MAX_TREE_SESSIONS = env.int("AGENT_MAX_TREE_SESSIONS", default=50)
