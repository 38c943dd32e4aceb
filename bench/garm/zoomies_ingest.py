#!/usr/bin/env python3
"""Zoomies webhook ingest under exactly the load bench.py gives GARM: the same wrk script, the
same payload (GitHub's workflow_job.queued example rewritten by bench.payload_template), one new
job id per request, signed the same way. Run it and `bench.py --phases ingest` alternately.

    python3 zoomies_ingest.py --project PATH_TO_ZOOMIES --workdir DIR [--duration 20] [--conns 16]

Starts `manage.py controller --no-agent` on a fresh SQLite database in DIR, with the payload's
installation added, runs wrk, waits until the controller's process tree is quiet, and prints
one JSON line: wrk's figures, jobs recorded, and the tree's CPU seconds per recorded job.
"""
import argparse, json, os, socket, sqlite3, subprocess, sys, time, urllib.request  # noqa: E401

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench as harness  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--project", default=".")
ap.add_argument("--workdir", required=True)
ap.add_argument("--duration", type=int, default=20)
ap.add_argument("--conns", type=int, default=16)
ap.add_argument("--web", type=int, default=0,
                help="N `manage.py web --reuse-port` processes and one `manage.py workers` on the "
                     "same SQLite file instead of the controller (the scale-out shape, no Redis)")
ap.add_argument("--floor", action="store_true",
                help="serve bench/floor_asgi.py under daphne instead: the web server's own cost")
a = ap.parse_args()
project, work = os.path.abspath(a.project), os.path.abspath(a.workdir)
os.makedirs(work, exist_ok=True)
py = os.path.join(project, ".venv", "bin", "python")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
secret = "zoomies-bench-secret"
env = dict(os.environ, ZOOMIES_DB=f"{work}/z.db", ZOOMIES_DATA_DIR=f"{work}/data",
           ZOOMIES_GITHUB_WEBHOOK_SECRET=secret)
run = dict(cwd=project, env=env, check=True, capture_output=True)
tmpl = harness.payload_template("http://127.0.0.1:1")
if a.floor:
    serve = [py, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "bench.floor_asgi:application"]
else:
    subprocess.run([py, "manage.py", "migrate", "--noinput"], **run)
    subprocess.run([py, "manage.py", "add_installation", "--id", str(tmpl["installation"]["id"]),
                    "--account", harness.OWNER, "--repo", f"{harness.OWNER}/{harness.REPO}"], **run)
    serve = [py, "manage.py", "controller", "--bind", f"127.0.0.1:{port}", "--no-agent"]
    if a.web:  # one shell waits on them all, so the tree's CPU counts every one
        web = f"{py} manage.py web --bind 127.0.0.1:{port} --reuse-port"
        serve = ["sh", "-c", " & ".join([f"{py} manage.py workers"] + [web] * a.web) + " & wait"]
log = open(f"{work}/controller.log", "w")
ctl = subprocess.Popen(serve, cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT,
                       start_new_session=True)
base = f"http://127.0.0.1:{port}"
for _ in range(240):
    try:
        urllib.request.urlopen(base + "/healthz", timeout=1); break
    except Exception:
        time.sleep(0.5)
time.sleep(3)


def tree_cpu():
    """CPU seconds of the controller and every process below it: its children lead process
    groups of their own, so the controller's group alone would leave the web server out."""
    parents, stats = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(pid)], stats[int(pid)] = int(f[1]), f
    tree, frontier = {ctl.pid}, [ctl.pid]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(stats[p][11]) + int(stats[p][12])) / tick for p in tree if p in stats)


bodies = f"{work}/bodies.tsv"


def run_wrk(seconds, label):
    # Delivery ids are the line numbers: a prefix per run keeps the probe's from being taken for
    # redeliveries of the main run's (Zoomies deduplicates on them; GARM does not).
    return subprocess.run(["wrk", "-t1", f"-c{a.conns}", f"-d{seconds}s", "--timeout", "10s", "-s",
                           os.path.join(HERE, "webhook_load.lua"), base + "/webhooks/github", "--",
                           bodies, "1"], capture_output=True, text=True,
                          env=dict(os.environ, WRK_DELIVERY_PREFIX=f"{label}-"))


def wrk_figures(out):
    lines = [x for x in out.stdout.splitlines() if x.startswith("WRK_RESULT ")]
    return json.loads(lines[-1][len("WRK_RESULT "):]) if lines else {"failed": out.stdout[-400:] + out.stderr[-400:]}


# As bench.py sizes GARM's: a short probe, then enough bodies that every request is a new job
# (a file that wraps around sends redeliveries, which cost less and would flatter the rate).
harness.write_bodies(bodies, tmpl, "http://127.0.0.1:1", 6_000_000_000, 20000, secret)
probe = wrk_figures(run_wrk(2, "probe"))
need = int(probe.get("rps", 1000) * a.duration * 1.6) + 2000
harness.write_bodies(bodies, tmpl, "http://127.0.0.1:1", 7_000_000_000, need, secret)
time.sleep(2)
c0 = tree_cpu()
def count_jobs():
    if a.floor:  # nothing is recorded: every answer counts
        return 0
    return sqlite3.connect(f"{work}/z.db").execute("select count(*) from runners_job").fetchone()[0]


jobs0 = count_jobs()
out = run_wrk(a.duration, "main")
c1 = last = tree_cpu()
quiet = 0
for _ in range(240):  # until the workers have caught up
    time.sleep(0.5)
    now = tree_cpu()
    quiet, last = (quiet + 1 if now - last < 0.05 else 0), now
    if quiet >= 4:
        break
cpu = tree_cpu() - c0
jobs = count_jobs() - jobs0
os.killpg(ctl.pid, 15); time.sleep(3)
try:
    os.killpg(ctl.pid, 9)
except ProcessLookupError:
    pass
wrk = wrk_figures(out)
if a.floor:
    jobs = wrk.get("status_counts", {}).get("200", 0)
print(json.dumps({"wrk": wrk, "jobs_recorded": jobs, "cpu_s": round(cpu, 2),
                  # while wrk ran, and the catch-up after it (the passes the burst woke)
                  "cpu_s_during": round(c1 - c0, 2), "cpu_s_after": round(cpu - (c1 - c0), 2),
                  "cpu_ms_per_job": round(1000 * cpu / max(jobs, 1), 2),
                  "load": open("/proc/loadavg").read().split()[:3]}))
