#!/usr/bin/env python3
"""Benchmark harness for GARM (peer of Zoomies), run against an already built binary.

    GARM_BIN=/path/to/garm python3 bench.py [--phases ingest,latency,burst] [--quick]

Everything listens on 127.0.0.1.  When run as root and `unshare` works, the
harness first re-executes itself in a private network namespace that has only
a loopback interface, so neither GARM nor anything else here can reach any
other address (GARM would otherwise try api.github.com for its agent-release
index).  GARM also gets HTTP(S)_PROXY=127.0.0.1:9 as a second fence.

Per GARM instance ("fresh" = new work dir, new SQLite DB):
  fake_github.py   GHES-style fake API (endpoint base http://127.0.0.1:<port>)
  fake_provider.sh external provider, records CreateInstance calls
  GARM             config.toml written here; first-run, login, controller URLs,
                   endpoint, PAT credentials, repo (webhook secret), pool
                   (min idle 0, labels bench,linux) done through GARM's REST API.

Phases:
  ingest   wrk + webhook_load.lua POSTs signed workflow_job "queued" deliveries
           (unique job ids) to /webhooks/<controller-id>; GARM's RSS/CPU sampled
           from /proc.  Runner creation is switched off during ingest by a huge
           minimum_job_age_backoff, so the figure is receive+verify+persist only.
           Also a run with wrong signatures (rejection rate).
  latency  minimum_job_age_backoff=0; one job at a time, random phase: time from
           the webhook POST to the provider's CreateInstance.
  burst    50 and 200 jobs POSTed at once: time to first/median/last CreateInstance.
  profile  (not in the default set) one valid-ingest run with GARM's debug_server
           on; saves a Go CPU profile, and `go tool pprof -top` of it when $GO or
           `go` is available.

Results: <workdir>/results.json (raw + summary) and a printed summary.
"""
import argparse
import concurrent.futures as cf
import hashlib
import hmac
import http.client
import json
import os
import random
import shutil
import signal
import tempfile
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ANCHOR = os.path.join(HERE, "..", "..", "tests", "fixtures", "github", "webhooks",
                      "workflow_job.queued.json")
OWNER, REPO = "bench-org", "bench-repo"
LABELS = ["bench", "linux"]
SECRET = "bench-webhook-secret-3f9a1c7e5b2d4a6f"
ADMIN_USER, ADMIN_PASS = "admin", "Zx9!bench-Garm-pass-4d7e1a2c"
DB_PASSPHRASE = "Qm7#vT2pL9xW4kR8zN3cY6bH1jF5sD0a"  # 32 chars, passes zxcvbn score 4
JWT_SECRET = "bench-jwt-secret-" + "k3J9sL2mQ8vX5zR1tY7wB4nC6pH0dF2g"
NOPROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def summarize(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0}


# ---------------------------------------------------------------- payloads
def payload_template(fake_base):
    if os.path.exists(ANCHOR):
        with open(ANCHOR) as f:
            d = json.load(f)
    else:  # same shape as GitHub's documented example, smaller repository object
        d = {"action": "queued",
             "workflow_job": {"id": 1, "run_id": 1, "run_attempt": 1, "node_id": "X", "head_sha": "0" * 40,
                              "head_branch": "main", "status": "queued", "conclusion": None,
                              "started_at": "2024-01-01T00:00:00Z", "created_at": "2024-01-01T00:00:00Z",
                              "completed_at": None, "name": "build", "steps": [], "labels": [],
                              "runner_id": None, "runner_name": None, "runner_group_id": None,
                              "runner_group_name": None, "workflow_name": "CI"},
             "repository": {"id": 1, "node_id": "R", "name": "", "full_name": "", "private": True,
                            "owner": {"login": "", "id": 1, "type": "Organization"}},
             "sender": {"login": "octocat", "id": 1, "type": "User"}}
    d["action"] = "queued"
    wj = d["workflow_job"]
    wj.update({"status": "queued", "conclusion": None, "completed_at": None, "labels": LABELS,
               "runner_id": None, "runner_name": None, "runner_group_id": None, "runner_group_name": None})
    r = d["repository"]
    r.update({"name": REPO, "full_name": f"{OWNER}/{REPO}", "html_url": f"{fake_base}/{OWNER}/{REPO}"})
    r["owner"]["login"] = OWNER
    return d


def make_delivery(tmpl, fake_base, job_id, secret=SECRET):
    wj = tmpl["workflow_job"]
    run_id = 900000000 + job_id // 4
    wj["id"] = job_id
    wj["run_id"] = run_id
    wj["html_url"] = f"{fake_base}/{OWNER}/{REPO}/actions/runs/{run_id}/job/{job_id}"
    wj["url"] = f"{fake_base}/api/v3/repos/{OWNER}/{REPO}/actions/jobs/{job_id}"
    wj["run_url"] = f"{fake_base}/api/v3/repos/{OWNER}/{REPO}/actions/runs/{run_id}"
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    wj["created_at"] = wj["started_at"] = ts
    body = json.dumps(tmpl, separators=(",", ":")).encode()
    sig = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return sig, body


def write_bodies(path, tmpl, fake_base, first_id, count, secret=SECRET):
    with open(path, "wb") as f:
        for i in range(count):
            sig, body = make_delivery(tmpl, fake_base, first_id + i, secret)
            f.write(sig.encode() + b"\t" + body + b"\n")


# ---------------------------------------------------------------- processes
class Sampler(threading.Thread):
    """Samples CPU time and RSS of a pid from /proc every `period` seconds."""

    def __init__(self, pid, period=0.25):
        super().__init__(daemon=True)
        self.pid, self.period, self.samples, self.stop_ev = pid, period, [], threading.Event()

    def read(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        rss = 0
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024.0
        return time.time(), cpu, rss

    def run(self):
        while not self.stop_ev.is_set():
            try:
                self.samples.append(self.read())
            except OSError:
                break
            self.stop_ev.wait(self.period)

    def stop(self):
        self.stop_ev.set()
        self.join()
        try:
            self.samples.append(self.read())
        except OSError:
            pass
        s = self.samples
        if len(s) < 2:
            return {}
        wall = s[-1][0] - s[0][0]
        cpu = s[-1][1] - s[0][1]
        rss = [x[2] for x in s]
        return {"wall_s": wall, "cpu_s": cpu, "cpu_pct_avg": 100.0 * cpu / wall if wall else None,
                "rss_mb_start": rss[0], "rss_mb_max": max(rss), "rss_mb_end": rss[-1],
                "rss_mb_median": statistics.median(rss)}


class Garm:
    def __init__(self, root, name, garm_bin, max_runners=1000, backoff=0, log_level="info", debug_server=False):
        self.dir = os.path.join(root, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.garm_bin, self.max_runners, self.backoff, self.log_level = garm_bin, max_runners, backoff, log_level
        self.procs = []
        self.token = None
        self.debug_server = debug_server

    # -- lifecycle
    def start(self):
        d = self.dir
        self.gh_port = free_port()
        self.gh = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_github.py"), "--port",
                                    str(self.gh_port), "--log", f"{d}/fake_github_requests.jsonl"],
                                   stdout=open(f"{d}/fake_github.out", "w"), stderr=subprocess.STDOUT)
        self.procs.append(self.gh)
        if not wait_port(self.gh_port):
            raise RuntimeError("fake github did not start")
        self.fake_base = f"http://127.0.0.1:{self.gh_port}"
        self.state = f"{d}/provider-state"
        os.makedirs(self.state)
        self.calls = f"{self.state}/calls.tsv"
        open(self.calls, "w").close()
        with open(f"{d}/provider.conf", "w") as f:
            f.write(f"FAKE_PROVIDER_STATE={self.state}\n")
        self.port = free_port()
        with open(f"{d}/config.toml", "w") as f:
            f.write(f"""[default]
enable_webhook_management = false
debug_server = {str(self.debug_server).lower()}

[logging]
log_file = "{d}/garm.log"
log_format = "text"
log_level = "{self.log_level}"
enable_log_streamer = false

[metrics]
enable = false

[jwt_auth]
secret = "{JWT_SECRET}"
time_to_live = "8760h"

[apiserver]
bind = "127.0.0.1"
port = {self.port}
use_tls = false
  [apiserver.webui]
  enable = false

[database]
backend = "sqlite3"
passphrase = "{DB_PASSPHRASE}"
  [database.sqlite3]
  db_file = "{d}/garm.db"

[[provider]]
name = "fake"
provider_type = "external"
description = "benchmark dummy provider"
  [provider.external]
  provider_executable = "{HERE}/fake_provider.sh"
  config_file = "{d}/provider.conf"
  interface_version = "v0.1.1"
""")
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env.update({"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
                    "NO_PROXY": "127.0.0.1,localhost", "http_proxy": "http://127.0.0.1:9",
                    "https_proxy": "http://127.0.0.1:9", "no_proxy": "127.0.0.1,localhost"})
        self.proc = subprocess.Popen([self.garm_bin, "--config", f"{d}/config.toml"], env=env,
                                     stdout=open(f"{d}/garm.stdout", "w"), stderr=subprocess.STDOUT)
        self.procs.append(self.proc)
        if not wait_port(self.port, 60):
            raise RuntimeError(f"GARM did not open its port; see {d}/garm.log")
        self.base = f"http://127.0.0.1:{self.port}"
        self.setup()

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # -- REST
    def api(self, method, path, body=None, ok=(200, 201)):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with NOPROXY.open(req, timeout=30) as r:
                raw = r.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path} -> {e.code}: {e.read()[:500]!r}")

    def setup(self):
        self.api("POST", "/api/v1/first-run", {"username": ADMIN_USER, "password": ADMIN_PASS,
                                                "email": "admin@bench.invalid", "full_name": "Bench Admin"})
        self.token = self.api("POST", "/api/v1/auth/login",
                              {"username": ADMIN_USER, "password": ADMIN_PASS})["token"]
        b = self.base
        ctrl = self.api("PUT", "/api/v1/controller", {
            "metadata_url": f"{b}/api/v1/metadata", "callback_url": f"{b}/api/v1/callbacks",
            "webhook_url": f"{b}/webhooks", "agent_url": f"{b}/agent",
            "garm_agent_releases_url": f"{self.fake_base}/garm-agent/releases",
            "enable_agent_tools_sync": False, "minimum_job_age_backoff": self.backoff})
        self.controller = ctrl
        self.webhook_url = ctrl["controller_webhook_url"]
        self.api("POST", "/api/v1/github/endpoints", {
            "name": "fake-ghes", "description": "fake GHES on loopback",
            "base_url": self.fake_base, "api_base_url": f"{self.fake_base}/api/v3/",
            "upload_base_url": f"{self.fake_base}/api/uploads/"})
        self.api("POST", "/api/v1/github/credentials", {
            "name": "fake-pat", "description": "PAT for fake GHES", "endpoint": "fake-ghes",
            "auth_type": "pat", "pat": {"oauth2_token": "ghp_fakebenchtoken0000000000000000000000"}})
        repo = self.api("POST", "/api/v1/repositories", {
            "owner": OWNER, "name": REPO, "credentials_name": "fake-pat", "webhook_secret": SECRET,
            "pool_balancer_type": "roundrobin", "forge_type": "github"})
        self.repo_id = repo["id"]
        pool = self.api("POST", f"/api/v1/repositories/{self.repo_id}/pools", {
            "provider_name": "fake", "max_runners": self.max_runners, "min_idle_runners": 0,
            "image": "ubuntu:24.04", "flavor": "default", "os_type": "linux", "os_arch": "amd64",
            "tags": LABELS, "enabled": True, "runner_bootstrap_timeout": 20})
        self.pool_id = pool["id"]
        end = time.time() + 60
        while time.time() < end:
            st = self.api("GET", f"/api/v1/repositories/{self.repo_id}").get("pool_manager_status", {})
            if st.get("running"):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"pool manager not running: {st}")
        self.pm_running_at = time.time()

    def set_backoff(self, seconds):
        self.api("PUT", "/api/v1/controller", {"minimum_job_age_backoff": seconds})

    def create_calls(self):
        out = []
        with open(self.calls) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) >= 3 and p[1] == "CreateInstance":
                    out.append((float(p[0]), p[2]))
        return out

    def unknown_requests(self):
        unk = {}
        try:
            with open(f"{self.dir}/fake_github_requests.jsonl") as f:
                for line in f:
                    r = json.loads(line)
                    if r.get("unknown"):
                        k = f"{r['method']} {r['path']}"
                        unk[k] = unk.get(k, 0) + 1
        except OSError:
            pass
        return unk


# ---------------------------------------------------------------- webhook client
class Poster:
    """Keep-alive HTTP/1.1 client for the webhook URL (one connection per thread)."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.path = u.hostname, u.port, u.path
        self.local = threading.local()

    def post(self, sig, body):
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = http.client.HTTPConnection(self.host, self.port, timeout=30)
        c.request("POST", self.path, body=body, headers={
            "Content-Type": "application/json", "X-GitHub-Event": "workflow_job",
            "X-GitHub-Hook-Installation-Target-Type": "repository",
            "X-GitHub-Delivery": str(random.getrandbits(64)), "X-Hub-Signature-256": sig,
            "User-Agent": "GitHub-Hookshot/bench"})
        r = c.getresponse()
        r.read()
        return r.status


# ---------------------------------------------------------------- phases
def run_wrk(args, g, bodies, conns, duration, tag):
    res_path = f"{g.dir}/wrk-{tag}.json"
    cmd = [args.wrk, "-t", str(args.wrk_threads), "-c", str(conns), "-d", f"{duration}s", "--timeout", "10s",
           "-s", os.path.join(HERE, "webhook_load.lua"), g.webhook_url, "--", bodies, str(args.wrk_threads)]
    samp = Sampler(g.proc.pid)
    samp.start()
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, WRK_RESULT_JSON=res_path))
    res_proc = samp.stop()
    lines = [l for l in out.stdout.splitlines() if l.startswith("WRK_RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed: {out.stdout}\n{out.stderr}")
    res = json.loads(lines[-1][len("WRK_RESULT "):])
    res["garm_process"] = res_proc
    if res.get("requests"):
        res["garm_cpu_ms_per_req"] = 1000.0 * res_proc.get("cpu_s", 0) / res["requests"]
    return res


def phase_ingest(args, root, results):
    out = results.setdefault("ingest", {})
    tmpl = None
    plan = [("valid", args.ingest_conns, args.ingest_reps, SECRET),
            ("valid_c1", 1, args.ingest_c1_reps, SECRET),
            ("invalid_sig", args.ingest_conns, args.invalid_reps, "wrong-" + SECRET)]
    for kind, conns, reps, secret in plan:
        runs = []
        for rep in range(reps):
            g = Garm(root, f"ingest-{kind}-{rep}", args.garm_bin, max_runners=10, backoff=86400)
            try:
                g.start()
                tmpl = payload_template(g.fake_base)
                idle = Sampler(g.proc.pid)
                idle.start()
                time.sleep(2)
                idle_stats = idle.stop()
                bodies = f"{g.dir}/bodies.tsv"
                # short probe to size the body file (every delivery must be a new job id)
                write_bodies(bodies, tmpl, g.fake_base, 10_000_000, 20000, secret)
                probe = run_wrk(args, g, bodies, conns, 2, "probe")
                need = int(probe["rps"] * args.duration * 1.6) + 2000
                write_bodies(bodies, tmpl, g.fake_base, 20_000_000, need, secret)
                r = run_wrk(args, g, bodies, conns, args.duration, "main")
                r["garm_idle"] = idle_stats
                r["payload_bytes"] = len(make_delivery(tmpl, g.fake_base, 1)[1])
                r["probe_rps"] = probe["rps"]
                r["unknown_github_requests"] = g.unknown_requests()
                runs.append(r)
                log(f"ingest {kind} rep{rep}: {r['rps']:.0f} req/s p50 {r['lat_ms']['p50']:.2f} ms "
                    f"p99 {r['lat_ms']['p99']:.2f} ms status {r['status_counts']} wrapped {r['wrapped']} "
                    f"cpu {r['garm_process'].get('cpu_pct_avg', 0):.0f}% rss max "
                    f"{r['garm_process'].get('rss_mb_max', 0):.0f} MB")
            finally:
                g.stop()
        out[kind] = {"conns": conns, "duration_s": args.duration, "runs": runs, "summary": {
            "rps": summarize([r["rps"] for r in runs]),
            "p50_ms": summarize([r["lat_ms"]["p50"] for r in runs]),
            "p90_ms": summarize([r["lat_ms"]["p90"] for r in runs]),
            "p99_ms": summarize([r["lat_ms"]["p99"] for r in runs]),
            "garm_cpu_pct": summarize([r["garm_process"].get("cpu_pct_avg") for r in runs]),
            "garm_cpu_ms_per_req": summarize([r.get("garm_cpu_ms_per_req") for r in runs]),
            "garm_rss_mb_max": summarize([r["garm_process"].get("rss_mb_max") for r in runs]),
            "garm_rss_mb_idle": summarize([r["garm_idle"].get("rss_mb_end") for r in runs]),
        }}


def phase_profile(args, root, results):
    """One valid-ingest run with GARM's pprof server on; CPU profile saved next to results."""
    g = Garm(root, "profile-ingest", args.garm_bin, max_runners=10, backoff=86400, debug_server=True)
    try:
        g.start()
        tmpl = payload_template(g.fake_base)
        bodies = f"{g.dir}/bodies.tsv"
        write_bodies(bodies, tmpl, g.fake_base, 50_000_000, 1200 * args.duration)
        prof = f"{g.dir}/cpu.pprof"
        secs = max(1, args.duration - 2)

        def grab():
            with NOPROXY.open(f"{g.base}/debug/pprof/profile?seconds={secs}", timeout=secs + 30) as r, \
                    open(prof, "wb") as f:
                f.write(r.read())
        th = threading.Thread(target=grab)
        th.start()
        time.sleep(0.2)
        r = run_wrk(args, g, bodies, args.ingest_conns, args.duration, "profile")
        th.join()
        top = None
        go = os.environ.get("GO") or shutil.which("go")
        if go:
            top = subprocess.run([go, "tool", "pprof", "-top", "-nodecount=30", args.garm_bin, prof],
                                 capture_output=True, text=True).stdout
            with open(f"{g.dir}/cpu-top.txt", "w") as f:
                f.write(top)
        results["profile"] = {"pprof": prof, "rps_with_profiler": r["rps"], "top": top}
        log(f"profile: {prof} ({r['rps']:.0f} req/s while profiling)" + ("" if top else "; set GO to print -top"))
    finally:
        g.stop()


def wait_creates(g, before, n, timeout):
    end = time.time() + timeout
    while time.time() < end:
        calls = g.create_calls()
        if len(calls) >= before + n:
            return calls[before:before + n]
        time.sleep(0.02)
    return g.create_calls()[before:]


def phase_latency(args, root, results):
    g = Garm(root, "latency-single", args.garm_bin, max_runners=1000, backoff=0)
    samples = []
    try:
        g.start()
        tmpl = payload_template(g.fake_base)
        poster = Poster(g.webhook_url)
        job = 30_000_000
        for i in range(args.single_reps):
            time.sleep(random.uniform(0.5, 5.5))  # random phase against GARM's 5 s loops
            before = len(g.create_calls())
            job += 1
            sig, body = make_delivery(tmpl, g.fake_base, job)
            t0 = time.time()
            st = poster.post(sig, body)
            t_ack = time.time()
            got = wait_creates(g, before, 1, 60)
            lat = got[0][0] - t0 if got else None
            samples.append({"status": st, "ack_ms": 1000 * (t_ack - t0), "latency_s": lat})
            log(f"single job {i}: HTTP {st} ack {1000 * (t_ack - t0):.1f} ms -> CreateInstance "
                f"{'timeout' if lat is None else f'{lat:.2f} s'}")
    finally:
        g.stop()
    results["latency_single"] = {"samples": samples,
                                 "summary": summarize([s["latency_s"] for s in samples]),
                                 "unknown_github_requests": g.unknown_requests()}


def phase_burst(args, root, results):
    out = results.setdefault("burst", {})
    for n in args.bursts:
        runs = []
        for rep in range(args.burst_reps):
            g = Garm(root, f"burst-{n}-{rep}", args.garm_bin, max_runners=max(1000, 2 * n), backoff=0)
            try:
                g.start()
                tmpl = payload_template(g.fake_base)
                poster = Poster(g.webhook_url)
                deliveries = [make_delivery(tmpl, g.fake_base, 40_000_000 + rep * 10_000 + i) for i in range(n)]
                time.sleep(random.uniform(0.5, 5.5))
                before = len(g.create_calls())
                samp = Sampler(g.proc.pid)
                samp.start()
                t0 = time.time()
                with cf.ThreadPoolExecutor(args.burst_conns) as ex:
                    statuses = list(ex.map(lambda d: poster.post(*d), deliveries))
                t_posted = time.time()
                got = wait_creates(g, before, n, 300)
                proc = samp.stop()
                ts = sorted(t for t, _ in got)
                r = {"n": n, "http_status": {str(s): statuses.count(s) for s in set(statuses)},
                     "post_all_s": t_posted - t0, "creates_seen": len(ts),
                     "first_s": ts[0] - t0 if ts else None,
                     "median_s": statistics.median(ts) - t0 if ts else None,
                     "last_s": ts[-1] - t0 if len(ts) == n else None,
                     "garm_process": proc, "unknown_github_requests": g.unknown_requests()}
                runs.append(r)
                log(f"burst {n} rep{rep}: posted in {r['post_all_s']:.2f} s, statuses {r['http_status']}, "
                    f"creates {len(ts)}/{n}, first {r['first_s']}, last {r['last_s']}")
            finally:
                g.stop()
        out[str(n)] = {"runs": runs, "summary": {
            "last_s": summarize([r["last_s"] for r in runs]),
            "first_s": summarize([r["first_s"] for r in runs]),
            "median_s": summarize([r["median_s"] for r in runs]),
            "post_all_s": summarize([r["post_all_s"] for r in runs])}}


# ---------------------------------------------------------------- main
def ensure_netns():
    if os.environ.get("GARM_BENCH_NETNS") or os.environ.get("GARM_BENCH_NO_NETNS"):
        return
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        log("warning: not isolating the network (need root, unshare and ip); relying on proxy fence")
        return
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        log("warning: unshare -n failed; relying on proxy fence")
        return
    os.environ["GARM_BENCH_NETNS"] = "1"
    os.execvp("unshare", ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                          sys.executable, os.path.abspath(__file__), *sys.argv[1:]])


def machine_info(garm_bin):
    info = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nproc": os.cpu_count(),
            "loadavg_start": open("/proc/loadavg").read().split()[:3], "garm_bin": garm_bin,
            "netns_isolated": bool(os.environ.get("GARM_BENCH_NETNS"))}
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["garm_version"] = subprocess.run([garm_bin, "version"], capture_output=True, text=True,
                                              timeout=10).stdout.strip()
    except Exception:
        pass
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--garm-bin", default=os.environ.get("GARM_BIN"))
    ap.add_argument("--workdir", default=os.environ.get("GARM_BENCH_WORKDIR", os.path.join(tempfile.gettempdir(), "garm-bench-run")))
    ap.add_argument("--wrk", default=os.environ.get("WRK", "wrk"))
    ap.add_argument("--phases", default="ingest,latency,burst")
    ap.add_argument("--duration", type=int, default=10, help="seconds per ingest run")
    ap.add_argument("--ingest-conns", type=int, default=16)
    ap.add_argument("--wrk-threads", type=int, default=1)
    ap.add_argument("--ingest-reps", type=int, default=5)
    ap.add_argument("--ingest-c1-reps", type=int, default=3)
    ap.add_argument("--invalid-reps", type=int, default=3)
    ap.add_argument("--single-reps", type=int, default=10)
    ap.add_argument("--bursts", default="50,200")
    ap.add_argument("--burst-reps", type=int, default=3)
    ap.add_argument("--burst-conns", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="1 rep of everything, 5 s ingest")
    args = ap.parse_args()
    if not args.garm_bin or not os.access(args.garm_bin, os.X_OK):
        sys.exit("set GARM_BIN (or --garm-bin) to an executable GARM binary")
    args.garm_bin = os.path.abspath(args.garm_bin)
    ensure_netns()
    args.bursts = [int(x) for x in args.bursts.split(",") if x]
    if args.quick:
        args.duration, args.ingest_reps, args.ingest_c1_reps, args.invalid_reps = 5, 1, 1, 1
        args.single_reps, args.burst_reps = 3, 1
    os.makedirs(args.workdir, exist_ok=True)
    results = {"machine": machine_info(args.garm_bin), "settings": {
        k: v for k, v in vars(args).items() if k != "quick"}}
    results["settings"].update({"pool": {"min_idle_runners": 0, "labels": LABELS, "provider": "fake_provider.sh"},
                                "garm_loops": "job consumer and add-pending loops tick every 5 s (compiled in)",
                                "ingest_backoff_s": 86400, "latency_backoff_s": 0, "garm_log_level": "info"})
    phases = args.phases.split(",")
    t_start = time.time()
    try:
        if "ingest" in phases:
            phase_ingest(args, args.workdir, results)
        if "latency" in phases:
            phase_latency(args, args.workdir, results)
        if "burst" in phases:
            phase_burst(args, args.workdir, results)
        if "profile" in phases:
            phase_profile(args, args.workdir, results)
    finally:
        results["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
        results["elapsed_s"] = time.time() - t_start
        with open(os.path.join(args.workdir, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps({k: v.get("summary", {kk: vv.get("summary") for kk, vv in v.items()
                                           if isinstance(vv, dict)})
                      for k, v in results.items() if k in ("ingest", "latency_single", "burst")}, indent=1))
    log(f"results: {os.path.join(args.workdir, 'results.json')}")


if __name__ == "__main__":
    main()
