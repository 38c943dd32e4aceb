"""The registry's entries: every operator setting, its default, range and help.

An entry is here only if production code reads it (a test fails otherwise); a setting waits
outside the registry until the issue that implements its behaviour adds it back.
"""

from __future__ import annotations

from zoomies_site.core.registry.types import (
    BOOL,
    CHOICE,
    DURATION,
    FLOAT,
    INT,
    LIST,
    STR,
    Derived,
    Setting,
    UnknownSetting,
    _dur,
    _half,
    _no_empty_items,
    _off_or_a_minute,
    _pem_private_key,
    _runner_env_items,
    _valid_bind,
    _valid_url,
    _whole_seconds,
    secret_weakness,
)

MIB = 1024 * 1024

# Quoted figures are the architecture's ("Reconciliation invariants" unless said otherwise);
# IDs are docs/requirements.md's. A constant another constant depends on says so beside it;
# validate() holds the relationships and tests/zoomies_site pins them at the defaults.
# fmt: off
_ENTRIES: tuple[Setting | Derived, ...] = (
    # The web server (zoomies_site/server.py): loopback by default (SEC-01); HTTPS when both
    # TLS paths are set; slow or oversized requests bounded before the application sees them.
    Setting("server.bind", STR, "127.0.0.1:8080",
            "The address and port the controller listens on, loopback only by default.",
            validator=_valid_bind),
    # ESC-09: where other machines reach this controller (scale-up events, the Hosts page's
    # join line); the bind is often loopback behind a proxy, which no machine can dial.
    Setting("server.public_url", STR, "",
            "The URL other machines reach this controller at, such as https://zoomies.example.",
            validator=lambda v: _valid_url(v) if v else None),
    Setting("server.tls_cert", STR, "",
            "Path to the PEM certificate chain the controller serves HTTPS with, empty for HTTP."),
    Setting("server.tls_key", STR, "",
            "Path to the PEM private key for server.tls_cert, empty for plain HTTP."),
    # Read by zoomies_site.core.transport: secure cookies and X-Forwarded-Proto trusted.
    Setting("server.tls_proxy", BOOL, False,
            "Whether a proxy in front terminates TLS and sets X-Forwarded-Proto for the browsers."),
    # Long enough for GitHub's largest delivery on a slow link (a second per MiB on top), short
    # enough that a client that declares a body and never sends it lets go of its connection.
    _dur("server.request_timeout", "15s",
         "How long a client may take to send a request, plus a second per MiB of its body.",
         lo="1s", hi="10m"),
    # Above GitHub's 25 MB, so each route refuses what it will not take in its own words
    # (webhooks: github.webhook_max_body); past this nothing is read at all.
    Setting("server.max_request_body", INT, 32 * MIB,
            "The largest request body in bytes the web server reads for any route.",
            min=MIB, max=1024 * MIB),
    Setting("server.max_connections_per_client", INT, 64,
            "How many connections one client address may hold open at once; more are refused.",
            min=4, max=100_000),
    # GitHub: App credentials, webhooks and the fallback poller ("When webhooks cannot reach you").
    Setting("github.api_url", STR, "https://api.github.com",
            "The GitHub REST API base URL, which differs only for GitHub Enterprise Server.",
            validator=_valid_url),
    Setting("github.app_id", INT, 0,
            "The GitHub App's numeric id, where 0 means no App is configured.", min=0),
    Setting("github.private_key_file", STR, "",
            "Path to the GitHub App's PEM private key, empty when no App is configured."),
    # AUTH-07: sealed in its SettingValue row; preferred to github.private_key_file when set
    # in the same layer or a later one. ZOOMIES_GITHUB_PRIVATE_KEY_FILE is not read as its
    # <VAR>_FILE: that is github.private_key_file's own variable, a path re-read when it changes.
    Setting("github.private_key", STR, "",
            "The GitHub App's PEM private key itself, stored sealed, preferred to the key file.",
            validator=_pem_private_key, secret=True),
    Setting("github.webhook_secrets", LIST, [],
            "The secrets a workflow_job webhook's HMAC signature may be made with.",
            validator=_no_empty_items, secret=True),
    # ZOOMIES_GITHUB_WEBHOOK_SECRET (or its _FILE): the one secret most installs have.
    Setting("github.webhook_secret", STR, "",
            "One more webhook secret, added to github.webhook_secrets, for an install with one.",
            secret=True),
    Setting("github.poll_fallback", BOOL, True,
            "Whether a poller lists queued jobs on an interval in case webhooks do not arrive."),
    _dur("github.poll_interval", "60s",
         "How often the fallback poller lists each installation's queued jobs.", lo="5s"),
    # GitHub never redelivers a dropped `queued`, so even while webhooks arrive each
    # installation's queued runs are swept: one call a repository a sweep, free when the
    # list is unchanged (304), plus one per queued run not yet known (README: Configuration).
    _dur("github.safety_sweep_interval", "2m",
         "How often queued runs are swept as webhooks arrive: at 2m, 30 calls/h a repository.",
         lo="30s", hi="1h"),
    Setting("github.sweep_budget", FLOAT, 0.25,
            "The share of an installation's or the App's hourly API quota that sweeps may spend.",
            min=0.05, max=1.0),
    # GitHub never redelivers a failed delivery; the pass asks for those that failed while
    # the controller was down or stalled (runners/redelivery.py), and runs once at start.
    _dur("github.redelivery_interval", "5m",
         "How often webhook deliveries that failed are asked for again, where 0s means never.",
         lo="0s", hi="1h", validator=_off_or_a_minute),
    # "Registrations are compared with rows a minute after start and every ten minutes after".
    _dur("github.reap_first_after", "1m",
         "How long after start the first orphaned-registration reap runs."),
    _dur("github.reap_interval", "10m",
         "How often registrations at GitHub are compared with the runner rows.", lo="1m"),
    # A rate-limited answer that names no reset waits this long, capped at GitHub's hour window.
    _dur("github.rate_limit_fallback", "15m",
         "How long an installation stands down after a rate limit that gave no reset time.",
         lo="1s", hi="1h"),
    _dur("github.rate_limit_cap", "1h",
         "The longest an installation stands down for a rate limit, whatever GitHub said.",
         lo="1m", hi="1h"),
    # GitHub caps webhook payloads at 25 MB; a larger body is not a real delivery.
    Setting("github.webhook_max_body", INT, 25 * MIB,
            "The largest webhook request body in bytes the controller will read.",
            min=64 * 1024, max=100 * MIB),
    # Scheduler ("A runner that has not come online in time is failed", SCHED-17..22).
    _dur("scheduler.provision_timeout", "20m",
         "How long a runner may take to come online, queue time included, before it is failed.",
         lo="1m"),
    _dur("scheduler.max_runner_lifetime", "0s",
         "How long an idle runner may live before it is retired, where 0s means no limit."),
    _dur("scheduler.idle_timeout", "0s",
         "How long a runner may sit idle before it is drained, where 0s means never."),
    _dur("scheduler.surplus_idle_timeout", "10m",
         "How long an idle runner beyond its pool's warm and queued need may stay, 0s: ever."),
    _dur("scheduler.unlinked_exit_grace", "1m",
         "How long a runner that ended with no job heard of still stands for the job it ran.",
         lo="0s", hi="10m"),
    # max_start_backoff <= failed_retention: the wait is computed from failures still kept.
    _dur("scheduler.failed_retention", "10m",
         "How long a failed runner stays on the Runners page before it is removed.", lo="1m"),
    _dur("scheduler.start_backoff", "10s",
         "A pool's first wait before creating again after a failed runner, doubled per failure.",
         lo="1s"),
    _dur("scheduler.max_start_backoff", "5m",
         "The longest a pool waits before creating again after failed runners.", lo="1s"),
    # SCHED-29..33: the pools the controller keeps from the hosts (runners.auto_pools).
    Setting("scheduler.auto_pools", BOOL, False,
            "Whether the controller keeps one automatic pool per platform its hosts report."),
    _dur("scheduler.auto_pools_host_grace", "10m",
         "How long a silent host still shapes the automatic pools; above host.lost_after.",
         lo="1m"),
    _dur("scheduler.size_class_hold", "10m",
         "How long an automatic pool keeps a size class before it may change again."),
    # HOST-14..17: a host's throttle, moved by fleet.throttling from its usage samples.
    Setting("scheduler.host_throttling", BOOL, True,
            "Whether a host whose samples show it short or overwhelmed is held and throttled."),
    Setting("agent.memory_valve", CHOICE, "on",
            "Whether agents raise a runner's memory limit before it runs out, or only observe.",
            choices=("on", "observe", "off")),
    _dur("scheduler.reconcile_interval", "5s",
         "How often the reconcile loop runs when nothing wakes it sooner.", lo="1s", hi="5m"),
    # The silence ladder (HOST-02, HOST-05): interval <= heartbeat_timeout / 2 and
    # heartbeat_timeout < host.lost_after.
    _dur("agent.heartbeat_interval", "30s",
         "How often each agent is told to send a heartbeat.", lo="1s"),
    _dur("agent.heartbeat_timeout", "90s",
         "How long a host may go without a heartbeat before it counts as unhealthy.", lo="3s"),
    _dur("host.lost_after", "5m",
         "How long a host may go without a heartbeat before its runners are failed.", lo="1m"),
    _dur("housekeeping.tick", "30s",
         "How often host health and other housekeeping judgements are made.", lo="1s"),
    _dur("agent.finished_retention", "0s",
         "How long the agent keeps a finished runner's workload after its end was reported."),
    # The stop lease must exceed runners.drain_grace + agent.stop_margin.
    _dur("agent.stop_margin", "1m",
         "The time the agent allows beyond a stop timeout for the stop itself to finish."),
    _dur("agent.orphan_grace", "2m",
         "How long a managed workload no runner row claims is left before the agent removes it.",
         lo="0s"),
    _dur("agent.missing_grace", "1m",
         "How long a newly created runner may be absent from the backend before it counts gone."),
    _dur("agent.bootstrap_cpu_grace", "2m",
         "How long a new runner keeps its full CPU quota before its host's throttle applies.",
         hi="10m"),
    _dur("agent.shutdown_grace", "30s",
         "How long a stopping agent waits for the tasks already in flight."),
    _dur("agent.long_poll_wait", "25s",
         "How long the controller holds an agent's task poll open when nothing is waiting.",
         lo="1s", hi="2m"),
    # Where the process backend finds GitHub's actions runner unpacked on the host.
    Setting("runners.actions_runner_dir", STR, "/opt/actions-runner",
            "The directory holding GitHub's actions runner (run.sh) for process-backend pools.",
            env="ZOOMIES_ACTIONS_RUNNER_DIR"),
    # BACK-11, BACK-12: rendered into runners' environments at create (runners/reconcile.py).
    # The stock image waits 120 s by default and takes 1..3600 s (docker/runner); the fleet
    # default is longer because a fresh sidecar's dockerd is slow on a host busy extracting.
    _dur("runners.docker_wait", "180s",
         "How long a Docker pool's runner waits for its Docker daemon (ZOOMIES_DOCKER_WAIT).",
         lo="1s", hi="1h", validator=_whole_seconds),
    Setting("runners.env", LIST, [],
            "KEY=VALUE variables given to every runner; a pool's own env overrides them by key.",
            validator=_runner_env_items),
    # "A busy runner in draining is given five minutes to finish" (RUN-11): the stop timeout.
    _dur("runners.drain_grace", "5m",
         "How long a busy draining runner is given to finish its job before it is stopped."),
    # Half the provision timeout (SCHED-18).
    Derived("runners.not_progressing", DURATION,
            "How long a runner may be not yet online before it is reported as not progressing.",
            _half("scheduler.provision_timeout"), ("scheduler.provision_timeout",)),
    _dur("runners.job_wait_warning", "10m",
         "How long a job may wait for a runner before the problems list names it and why.",
         lo="1m", hi="24h"),
    # GitHub itself ends a job whose runner stopped answering after about 10 minutes.
    _dur("runners.runner_gone_job_warning", "15m",
         "How long a job may stay in progress after its runner ended before it is a problem.",
         lo="1m", hi="24h"),
    # Task leases (TASK-03/04): each outlasts the work it covers (TASK-12).
    _dur("tasks.create_lease", "20m",
         "How long a delivered create task may go unanswered before it is offered again.",
         lo="1m"),
    _dur("tasks.stop_lease", "10m",
         "How long a delivered stop task may go unanswered before it is offered again.",
         lo="1m"),
    _dur("tasks.remove_lease", "5m",
         "How long a delivered remove task may go unanswered before it is offered again.",
         lo="1m"),
    Setting("tasks.max_attempts", INT, 3,
            "How many times a task is offered to its host before the host is given up on.",
            min=1, max=10),
    # Capacity demand to an external autoscaler (CAP-01..21) and the peer's event scaler
    # timings (ESC-02, ESC-06, ESC-15, ESC-16, ESC-18, ESC-22, ESC-25).
    Setting("capacity_demand.destination_url", STR, "",
            "Where capacity events are posted, empty to publish none.",
            validator=lambda v: _valid_url(v) if v else None),
    Setting("capacity_demand.signing_secret", STR, "",
            "The HMAC-SHA256 key that signs every capacity event (openssl rand -hex 32).",
            validator=secret_weakness, secret=True),
    Setting("capacity_demand.pools", LIST, [],
            "Pool ids or names whose capacity events are published, empty for every pool.",
            validator=_no_empty_items),
    _dur("capacity_demand.cooldown", "5m",
         "The shortest time between two delivery attempts for one pool and event type.",
         lo="10s"),
    _dur("capacity_demand.interval", "10s",
         "How often the capacity loop looks at the fleet and delivers what is due.", lo="1s"),
    _dur("capacity_demand.retry_backoff", "2s",
         "The wait before the second try of a delivery, doubled before the third.", lo="100ms"),
    _dur("capacity_demand.timeout", "10s",
         "How long one delivery try waits for the receiver's answer.", lo="1s", hi="1m"),
    Setting("capacity_demand.claim_codes", BOOL, False,
            "Whether a scale-up event carries a single-use claim code and a host name to join as."),
    _dur("capacity_demand.claim_ttl", "300s",
         "How long a claim code stays redeemable (claimTtlSeconds).", lo="10s"),
    # Read by fleet (the join and the renewal mint the credential); the agent renews at half
    # of it, so a minute leaves it 30 s between a renewal and the next.
    _dur("capacity_demand.agent_token_ttl", "600s",
         "How long an agent token minted from a claim code lives unless renewed (agentTokenTtl).",
         lo="1m", hi="24h"),
    Setting("capacity_demand.controller_url", STR, "",
            "The controller URL a claimed machine dials, empty for the agent's usual URL.",
            validator=lambda v: _valid_url(v) if v else None),
    _dur("capacity_demand.spawn_timeout", "5m",
         "How long a provision may go without its machine joining before it is torn down.",
         lo="30s"),
    _dur("capacity_demand.stranded_window", "30m",
         "How long a joined provision's host may stay unseen before it is torn down.",
         lo="1m"),
    _dur("capacity_demand.flap_grace", "2m",
         "How long the backstop watches a host's absence before it may tear the host down.",
         lo="10s"),
    _dur("capacity_demand.provision_backoff_base", "30s",
         "The scale-up deferral after one provision failure, doubled per further failure.",
         lo="1s"),
    _dur("capacity_demand.provision_backoff_max", "15m",
         "The ceiling on the doubling scale-up deferral.", lo="1s"),
    Setting("capacity_demand.max_consecutive_failures", INT, 5,
            "The failure count at which a held scale-up names repeated provision failure.",
            min=1, max=100),
    Setting("capacity_demand.max_provisions", INT, 10,
            "The most claimed provisions in flight at once, counted across the cluster.",
            min=1, max=10000),
    # Sign-in (accounts/login.py, accounts/oidc.py): password failures are counted per name
    # and per address over the window; OIDC is on when an issuer is set (AUTH-02).
    _dur("auth.login_window", "15m",
         "How long a failed password sign-in counts towards holding further sign-ins.",
         lo="1m", hi="24h"),
    Setting("auth.login_max_failures", INT, 5,
            "How many failed sign-ins for one username within the window hold its sign-ins.",
            min=1, max=1000),
    Setting("auth.login_max_failures_per_ip", INT, 50,
            "How many failed sign-ins from one address within the window hold its sign-ins.",
            min=1, max=100_000),
    Setting("auth.oidc_issuer", STR, "",
            "The OpenID provider's issuer URL for single sign-on, empty to turn it off.",
            validator=lambda v: _valid_url(v) if v else None),
    Setting("auth.oidc_client_id", STR, "",
            "The client id Zoomies is registered under at the OpenID provider."),
    Setting("auth.oidc_client_secret", STR, "",
            "The client secret Zoomies is registered with at the OpenID provider.", secret=True),
    Setting("auth.oidc_role_claim", STR, "groups",
            "The claim whose values (groups) decide an SSO user's role."),
    Setting("auth.oidc_admin_groups", LIST, [],
            "Values of the role claim that make an SSO user an admin.",
            validator=_no_empty_items),
    Setting("auth.oidc_operator_groups", LIST, [],
            "Values of the role claim that make an SSO user an operator.",
            validator=_no_empty_items),
    Setting("auth.oidc_viewer_groups", LIST, [],
            "Values of the role claim that make an SSO user a viewer; no match is refused.",
            validator=_no_empty_items),
    # Backups (zoomies_site/backup, BAK-01..06): the directory, the schedule and its
    # retention, the passphrase scheduled and API copies are encrypted with, and the remotes.
    Setting("backup.dir", STR, "",
            "The directory backups are written to, empty for backups/ in the data directory."),
    _dur("backup.interval", "0s",
         "How often the controller takes a scheduled backup, where 0s means never.",
         lo="0s", hi="30d"),
    Setting("backup.keep", INT, 7,
            "How many of the newest backups retention keeps, here and at each remote.",
            min=1, max=10_000),
    Setting("backup.keep_days", INT, 0,
            "How many days a backup is kept at most, where 0 means no age limit.",
            min=0, max=3650),
    Setting("backup.passphrase", STR, "",
            "The passphrase scheduled and API backups are encrypted with, empty for none.",
            secret=True),
    Setting("backup.remotes", LIST, [],
            "The s3://bucket/prefix destinations every scheduled backup is copied to.",
            validator=_no_empty_items),
    Setting("backup.s3_endpoint_url", STR, "",
            "The S3-compatible server's URL for backup.remotes, empty for Amazon S3.",
            validator=lambda v: _valid_url(v) if v else None),
    Setting("backup.s3_region", STR, "us-east-1",
            "The region the backup remotes' buckets are in."),
    Setting("backup.s3_access_key_id", STR, "",
            "The access key id for the backup remotes, empty for the host's own credentials."),
    Setting("backup.s3_secret_access_key", STR, "",
            "The secret access key that goes with backup.s3_access_key_id.", secret=True),
    # Rented machines (capacity/machines.py, MACH-11..15): the loop's pace, how long a machine
    # may idle or take to join, the cap across every provider, and where its agent dials.
    _dur("machines.interval", "5s",
         "How often the machine loop plans machines and moves each one along.", lo="1s"),
    _dur("machines.idle_timeout", "10m",
         "How long a rented machine may have no runner before it is drained and deleted.",
         lo="10s"),
    _dur("machines.join_timeout", "10m",
         "How long a rented machine's agent may take to join before the machine fails.",
         lo="10s"),
    Setting("machines.max_total", INT, 10,
            "The most rented machines at once, across every provider.", min=0, max=10_000),
    Setting("machines.controller_url", STR, "",
            "The URL a rented machine's agent dials, empty for this host's loopback listener.",
            validator=lambda v: _valid_url(v) if v else None),
    # One controller per database: renew well inside the lease (renew < ttl / 2).
    _dur("controller.lease_ttl", "30s",
         "How long the controller's database lease lasts without a renewal.", lo="5s"),
    _dur("controller.lease_renew", "10s",
         "How often the controller renews its database lease.", lo="1s"),
)
# fmt: on

ENTRIES: dict[str, Setting | Derived] = {entry.key: entry for entry in _ENTRIES}
SETTINGS: dict[str, Setting] = {e.key: e for e in _ENTRIES if isinstance(e, Setting)}
DERIVED: dict[str, Derived] = {e.key: e for e in _ENTRIES if isinstance(e, Derived)}
KEYS: tuple[str, ...] = tuple(ENTRIES)
# A secret's <VAR>_FILE that is another entry's variable (ZOOMIES_GITHUB_PRIVATE_KEY_FILE) is
# that entry's, and is not read twice.
_OWN_ENV_NAMES = frozenset(s.env for s in SETTINGS.values())
assert len(ENTRIES) == len(_ENTRIES), "duplicate setting key"  # noqa: S101  # narrows the type; the code above guarantees it


def entry(key: str) -> Setting | Derived:
    try:
        return ENTRIES[key]
    except KeyError:
        raise UnknownSetting(key) from None
