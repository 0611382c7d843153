"""tether benchmarks (SPEC §9). One command: ``.venv/bin/python bench/run.py [--quick]``.

Each figure is the median over repeated runs, next to a baseline measured in the same run,
and written to ``bench/results/latest.json``. Timings here are reports, never pass/fail.

- store:   appends/s through the store interface vs raw sqlite3 inserts, same mode
           (WAL, synchronous=NORMAL, one transaction per append).
- latency: child run end -> parent wake run start, local and linked over loopback
           (p50, p99); baseline: a loopback HTTP round trip with the same client.
- fanout:  one parent, N async tasks (half remote), each with a background wake;
           tasks/s end to end, all delivered exactly once, with transactions, events,
           CPU seconds (both servers, and their commands' wrappers) and KiB written per task;
           baseline: raw sqlite3 inserts (one transaction each) of the same number of
           events, and the ratio.
- stores:  the fan-out (local children only) on SQLite with one process beside PostgreSQL
           with 1, 2 and 4 processes on one database (SPEC §12), in the same run; ratios to
           SQLite, CPU seconds of tether and of PostgreSQL, and how often the one write
           lock was held and waited for. Skipped, saying so, without PostgreSQL
           (initdb/pg_ctl) or psycopg.
- restart: start-up time with N open tasks until the server answers (recovery done), and
  until its MCP endpoint is in (the SDK loads after the server answers).
- memory:  server RSS per idle thread and per open task, at 100 and at the full size.
- mixed:   many clients at once (admin, a link token, a thread credential; reads, writes,
           SSE, MCP, the web page) — requests/s and p50/p99 while tasks with monitors and
           background commands run on both linked environments, beside the same clients
           against the same servers idle (the driver is tests/stress/load.py).

The servers' data goes under ``--scratch`` (default ``~/.cache``, where a user's data would
be); the results say how fast that file system made two files (``scratchFileCreateMicros``),
as every background command's start does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

# The mixed-load figure uses the stress suite's load driver, so both measure the same clients.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from stress.load import Client, Record, run_load
from tether.domain.records import Task, Thread
from tether.ids import millis_between, new_id, now
from tether.launch import Server
from tether.store.sqlite import SQLiteStore

RESULTS = Path(__file__).parent / "results"


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], 3)


# ---------------------------------------------------------------------- store


def bench_store(root: Path, n: int, repeats: int) -> dict[str, Any]:
    ours, raw = [], []
    root.mkdir()
    for r in range(repeats):
        store = SQLiteStore(root / f"s{r}.db")
        start = time.perf_counter()
        for i in range(n):
            with store.transaction() as tx:
                tx.append_event("bench.event", {"i": i, "text": "x" * 64}, thread_id="thr_bench")
        ours.append(n / (time.perf_counter() - start))
        store.close()
        conn = sqlite3.connect(root / f"r{r}.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT, at TEXT, "
            "thread_id TEXT, data TEXT)"
        )
        start = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO events (type, at, thread_id, data) VALUES (?, ?, ?, ?)",
                ("bench.event", now(), "thr_bench", json.dumps({"i": i, "text": "x" * 64})),
            )
            conn.execute("COMMIT")
        raw.append(n / (time.perf_counter() - start))
        conn.close()
    return {
        "appendsPerSecond": median(ours),
        "rawInsertsPerSecond": median(raw),
        "ratioRawOverOurs": round(median(raw) / median(ours), 2),
        "n": n,
        "repeats": repeats,
    }


# ---------------------------------------------------------------------- servers


def _script(rules: list[dict[str, Any]]) -> str:
    return json.dumps({"tether_script": 1, "rules": rules})


def _up(server: Server) -> Server:
    """Started, and done starting: the MCP SDK, which loads after the server answers, is
    in, so that its import does not eat into what is measured next."""
    server.start()
    _await_mcp(server)
    return server


def _start_pair(root: Path) -> tuple[Server, Server]:
    origin, peer = _up(Server(root / "origin", "origin")), _up(Server(root / "peer", "peer"))
    with peer.client() as client:
        token = client.post("/api/link-tokens", json={"label": "bench"}).json()["token"]
    with origin.client() as client:
        client.post("/api/links", json={"url": peer.url, "token": token}).raise_for_status()
    return origin, peer


def _wait_delivered(server: Server, parent_id: str, expected: int, timeout: float) -> list[dict[str, Any]]:
    """Follow the event feed until ``expected`` tasks of the parent delivered FINAL.

    Counting from the events themselves keeps the waiting O(events), and asking for
    ``task.delivery`` events only (``?types=``) leaves the rest of the feed (most of it)
    unsent and unparsed, so the client does not become what the fan-out figure measures:
    on 2 cores, its parsing of every event competed with the servers."""
    done: set[str] = set()
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {server.token}"}
    with httpx.stream(
        "GET",
        f"{server.url}/api/events",
        params={"after": "0", "types": "task.delivery"},
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=5.0),
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                task = event.get("data") or {}
                if (
                    event["type"] == "task.delivery"
                    and task.get("parentThreadId") == parent_id
                    and task["delivery"]["state"] in ("delivered", "acknowledged")
                    and (task.get("result") or {}).get("text") == "FINAL"
                ):
                    done.add(task["taskId"])
            if len(done) >= expected or time.monotonic() > deadline:
                break
    with server.client() as client:
        return client.get("/api/tasks", params={"parentThreadId": parent_id}).json()["tasks"]


def bench_latency(root: Path, n: int) -> dict[str, Any]:
    """Each of n children replies FINAL at once; latency = its run's end -> parent's wake start."""
    origin, peer = _start_pair(root)
    try:
        out: dict[str, Any] = {}
        with origin.client() as client:
            rtts = []
            for _ in range(max(50, n)):
                start = time.perf_counter()
                client.get("/api/health")
                rtts.append((time.perf_counter() - start) * 1000)
            out["baselineHttpRoundTripMs"] = {"p50": median(rtts), "p99": percentile(rtts, 0.99)}
        child = {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "FINAL"}]}]}
        for where, env in (("local", None), ("linked", "peer")):
            samples = []
            for _ in range(n):
                delegate = {"task": child, "id": "c"} | ({"environment": env} if env else {})
                script = _script(
                    [
                        {"on": "start", "do": [{"delegate": delegate}]},
                        {"on": "delegated_task", "do": [{"reply": "ok"}]},
                    ]
                )
                with origin.client() as client:
                    parent = client.post(
                        "/api/threads", json={"provider": "script", "message": script}
                    ).json()
                tasks = _wait_delivered(origin, parent["threadId"], 1, 30)
                task = tasks[0]
                with (peer if env else origin).client() as client:
                    runs = client.get(f"/api/threads/{task['childThreadId']}").json()["runs"]
                with origin.client() as client:
                    pruns = client.get(f"/api/threads/{parent['threadId']}").json()["runs"]
                answer = next(r for r in runs if r["runId"] == task["result"]["runId"])
                wake = next(r for r in pruns if r["runId"] == task["delivery"]["wakeRunId"])
                samples.append(millis_between(answer["endedAt"], wake["startedAt"]))
            out[where] = {"p50": median(samples), "p99": percentile(samples, 0.99), "n": n}
        return out
    finally:
        origin.stop()
        peer.stop()


#: The fan-out's child: it awaits a background ``true`` and answers FINAL when woken.
FANOUT_CHILD = {
    "tether_script": 1,
    "rules": [
        {
            "on": "start",
            "do": [{"bash": "true", "background": True, "await": True, "id": "b"}, {"reply": "WAITING"}],
        },
        {"on": "background_command", "do": [{"reply": "FINAL"}]},
    ],
}


def bench_fanout(root: Path, n: int) -> dict[str, Any]:
    origin, peer = _start_pair(root)
    actions = [
        {"delegate": {"task": FANOUT_CHILD, "id": f"c{i}"} | ({"environment": "peer"} if i % 2 else {})}
        for i in range(n)
    ]
    script = _script([{"on": "start", "do": actions}, {"on": "delegated_task", "repeat": True, "do": []}])
    try:
        before = [_stats(server) for server in (origin, peer)]
        start = time.perf_counter()
        with origin.client() as client:
            parent = client.post("/api/threads", json={"provider": "script", "message": script}).json()
        tasks = _wait_delivered(origin, parent["threadId"], n, 600)
        elapsed = time.perf_counter() - start
        after = [_stats(server) for server in (origin, peer)]
        used = {key: sum(a[key] - b[key] for a, b in zip(after, before, strict=True)) for key in after[0]}
        with origin.client() as client:
            view = client.get(f"/api/threads/{parent['threadId']}").json()
        wake_texts = [m["text"] for m in view["messages"] if m["role"] == "notification"]
        finals = sum(text.count("FINAL") for text in wake_texts)
        raw = _raw_inserts(root / "raw.db", used["events"])
        return {
            "tasks": n,
            "seconds": round(elapsed, 2),
            "tasksPerSecond": round(n / elapsed, 1),
            "deliveredExactlyOnce": finals == n and len(tasks) == n,
            "transactionsPerTask": round(used["transactions"] / n, 1),
            "eventsPerTask": round(used["events"] / n, 1),
            "cpuSecondsPerTask": round(used["cpuSeconds"] / n, 4),
            # The background commands' wrappers (two `sh` each), on the same 2 cores.
            "commandCpuSecondsPerTask": round(used["childCpuSeconds"] / n, 4),
            # What both servers wrote to files (the store's log and checkpoints, pid files).
            "kibWrittenPerTask": round(used["bytesWritten"] / n / 1024, 1),
            "baselineRawInsertsSeconds": round(raw, 3),
            "ratioOverBaseline": round(elapsed / raw, 1),
        }
    finally:
        origin.stop()
        peer.stop()


def _stats(server: Server) -> dict[str, float]:
    """Transactions, events, CPU seconds and bytes written of one server so far (both
    environments' work counts: the remote half runs in the peer); a count the platform
    does not keep (null) reads as 0."""
    with server.client() as client:
        return {key: value or 0 for key, value in client.get("/api/stats").json().items()}


def _fanout_on(servers: list[Server], n: int) -> dict[str, Any]:
    """One parent made through the first server delegates n local children; each awaits a
    background ``true`` and answers FINAL. Any server may carry out any of the work."""
    actions = [{"delegate": {"task": FANOUT_CHILD, "id": f"c{i}"}} for i in range(n)]
    script = _script([{"on": "start", "do": actions}, {"on": "delegated_task", "repeat": True, "do": []}])
    start = time.perf_counter()
    with servers[0].client() as client:
        parent = client.post("/api/threads", json={"provider": "script", "message": script}).json()
    tasks = _wait_delivered(servers[0], parent["threadId"], n, 900)
    elapsed = time.perf_counter() - start
    with servers[0].client() as client:
        view = client.get(f"/api/threads/{parent['threadId']}").json()
    finals = sum(m["text"].count("FINAL") for m in view["messages"] if m["role"] == "notification")
    return {
        "tasks": n,
        "seconds": round(elapsed, 2),
        "tasksPerSecond": round(n / elapsed, 1),
        "deliveredExactlyOnce": finals == n and len(tasks) == n,
    }


class _WriteLockSampler:
    """Samples ``pg_locks`` every ``every`` seconds on its own connection while a run goes
    on: how often the one write lock (``WRITE_LOCK``) is held, and how many transactions
    wait for it. Held nearly always with waiters behind it: writes are the limit, and
    per-thread locks would pay; held part of the time with few waiters: they would not."""

    def __init__(self, url: str, every: float = 0.02) -> None:
        self.url, self.every = url, every
        self.samples: list[tuple[int, int]] = []  # (holders, waiters)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        from tether.store.postgresql.store import WRITE_LOCK

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(self.every):
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) "
                    "FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid = %s",
                    (WRITE_LOCK,),
                ).fetchone()
                self.samples.append((int(row[0]), int(row[1])) if row else (0, 0))

    def __enter__(self) -> _WriteLockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, Any]:
        n = max(1, len(self.samples))
        return {
            "lockSamples": len(self.samples),
            "writeLockHeldShare": round(sum(1 for held, _ in self.samples if held) / n, 3),
            "writeLockWaitedShare": round(sum(1 for _, waiting in self.samples if waiting) / n, 3),
            "meanWaiting": round(sum(waiting for _, waiting in self.samples) / n, 2),
        }


def _postgres_cpu(cluster: Any) -> float:
    """CPU seconds the PostgreSQL server's processes have used so far."""
    import psutil

    postmaster = psutil.Process(int((cluster.root / "data" / "postmaster.pid").read_text().split()[0]))
    total = 0.0
    for proc in [postmaster, *postmaster.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue  # a backend that ended meanwhile
    return total


def _store_run(root: Path, count: int, url: str | None, cluster: Any, n: int) -> dict[str, Any]:
    """The fan-out on ``count`` processes (on ``url``, else SQLite), with the CPU seconds of
    the tether processes and of PostgreSQL, and (PostgreSQL) the write lock's samples."""
    env = {"TETHER_STORE": url} if url else {}
    servers = [_up(Server(root / f"p{i}", f"p{i}", env=env)) for i in range(count)]
    try:
        tether_cpu = sum(_stats(s)["cpuSeconds"] for s in servers)
        pg_cpu = _postgres_cpu(cluster) if url else 0.0
        if url:
            with _WriteLockSampler(url) as sampler:
                out = _fanout_on(servers, n)
            out.update(sampler.figures())
            out["postgresCpuSeconds"] = round(_postgres_cpu(cluster) - pg_cpu, 1)
        else:
            out = _fanout_on(servers, n)
        out["tetherCpuSeconds"] = round(sum(_stats(s)["cpuSeconds"] for s in servers) - tether_cpu, 1)
        return out
    finally:
        for server in servers:
            server.stop()


def bench_stores(root: Path, n: int) -> dict[str, Any]:
    """The same fan-out on SQLite (one process) and on PostgreSQL with 1, 2 and 4 processes."""
    try:
        from tether.store.postgresql.local import LocalCluster, find_bindir
    except ImportError:
        return {"skipped": "psycopg is not installed (pip install -e '.[postgresql]')"}
    bindir = find_bindir()
    if bindir is None:
        return {"skipped": "PostgreSQL is not installed (initdb/pg_ctl not found)"}
    cluster = LocalCluster(bindir).start()
    out: dict[str, Any] = {}
    try:
        out["sqlite"] = _store_run(root / "sqlite", 1, None, cluster, n)
        for count in (1, 2, 4):
            out[f"postgresql{count}"] = _store_run(root / f"pg{count}", count, cluster.database(), cluster, n)
    finally:
        cluster.stop()
    base = out["sqlite"]["tasksPerSecond"]
    for count in (1, 2, 4):
        run = out[f"postgresql{count}"]
        run["ratioToSqlite"] = round(run["tasksPerSecond"] / base, 2)
    return out


def _raw_inserts(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, data TEXT)")
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO events (data) VALUES (?)", (json.dumps({"i": i}),))
        conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - start


def _seed_open_tasks(data: Path, n: int) -> None:
    """n open tasks, each with its child thread, written straight into a new store."""
    store = SQLiteStore(data / "tether.db")
    with store.transaction() as tx:
        env = tx.get_meta("environment_id") or new_id("env")
        tx.set_meta("environment_id", env)
        parent = Thread(new_id("thr"), "script", now())
        tx.put(parent)
        for _ in range(n):
            task = Task(new_id("tsk"), env, parent.id, env, new_id("thr"), now(), status="running")
            tx.put(Thread(task.child_thread_id, "script", now(), root_task_id=task.id, open_task_id=task.id))
            tx.put(task)
    store.close()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _await_mcp(server: Server) -> None:
    """Until the MCP SDK, loaded after the server is up, is in (memory is read after it)."""
    while (state := httpx.get(f"{server.url}/api/health").json()["mcp"]) == "loading":
        time.sleep(0.02)  # the server has no event to await for this from outside
    if state != "ready":
        raise RuntimeError(f"the MCP endpoint of {server.name} is {state}")


def bench_restart_and_memory(root: Path, sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        data = root / f"restart-{n}"
        data.mkdir(parents=True)
        _seed_open_tasks(data, n)
        server = Server(data, f"r{n}")
        start = time.perf_counter()
        server.start(timeout=120)
        startup = time.perf_counter() - start
        _await_mcp(server)
        mcp_ready = time.perf_counter() - start
        rss = _rss_kib(server.process.pid) if server.process else 0
        server.stop()
        empty = _up(Server(root / f"empty-{n}", f"e{n}"))
        base = _rss_kib(empty.process.pid) if empty.process else 0
        empty.stop()
        out[str(n)] = {
            "openTasks": n,
            "startupSeconds": round(startup, 3),
            "mcpReadySeconds": round(mcp_ready, 3),
            "rssKiB": rss,
            "emptyRssKiB": base,
            "kibPerOpenTaskWithThread": round((rss - base) / n, 2),
        }
    return out


def _mixed_clients(origin: Server, peer: Server, watched: str) -> list[Client]:
    with peer.client() as client:
        link_token = client.post("/api/link-tokens", json={"label": "mixed"}).json()["token"]
    with origin.client() as client:
        credential = client.post(f"/api/threads/{watched}/credentials", json={}).json()["token"]
    return [
        *[Client(f"admin{n}", origin.url, origin.token, watched, web=True) for n in range(3)],
        *[Client(f"link{n}", peer.url, link_token) for n in range(3)],
        *[Client(f"credential{n}", origin.url, credential, watched, writes=False) for n in range(2)],
    ]


def _load_figures(record: Record, seconds: float) -> dict[str, Any]:
    ms = [s * 1000 for s in record.latencies]
    return {
        "requests": record.requests,
        "requests_per_s": round(record.requests / seconds, 1),
        "p50_ms": median(ms) if ms else None,
        "p99_ms": percentile(ms, 0.99) if ms else None,
        "5xx_or_broken": len(record.failures),
    }


def _measure_load(clients: list[Client], seconds: float) -> dict[str, Any]:
    start = time.perf_counter()
    record = run_load(clients, threading.Event(), seconds, seed=7)
    return _load_figures(record, time.perf_counter() - start)


def bench_mixed(root: Path, seconds: float, parents: int) -> dict[str, Any]:
    """The same clients for ``seconds``, first against idle servers, then while ``parents``
    parents each delegate 10 children (half remote) with a monitor and a background command."""
    origin, peer = _start_pair(root)
    try:
        child = {"tether_script": 1, "rules": [
            {"on": "start", "do": [{"monitor": "for i in 1 2 3 4 5; do echo $i; sleep 0.5; done"},
                                   {"bash": "sleep 2; echo OK", "background": True, "await": True},
                                   {"reply": "WAITING"}]},
            {"on": "monitor_event", "repeat": True, "do": [{"reply": "PROGRESS"}]},
            {"on": "any", "repeat": True, "do": [{"reply": "FINAL"}]}]}
        rules = [{"on": "start", "do": [
            *[{"delegate": {"task": child, **({"environment": "peer"} if n % 2 else {})}} for n in range(10)],
            {"reply": "delegated"}]}]
        with origin.client() as client:
            watched = client.post("/api/threads", json={"provider": "script", "title": "watched"}).json()
        clients = _mixed_clients(origin, peer, watched["threadId"])
        idle = _measure_load(clients, seconds)
        with origin.client() as client:
            for n in range(parents):
                client.post("/api/threads", json={"provider": "script", "title": f"p{n}",
                                                  "message": _script(rules)}).raise_for_status()
        busy = _measure_load(clients, seconds)
        return {
            "clients": len(clients),
            "seconds": seconds,
            "tasks": parents * 10,
            "idle": idle,
            "under_load": busy,
            "throughput_ratio": round(busy["requests_per_s"] / idle["requests_per_s"], 2),
            "limits": "one Python process per environment answers every client on one event loop; "
            "the SSE reads from the oldest event and the thread lists grow with the threads the "
            "writers create, so requests get heavier as the run goes on",
        }
    finally:
        origin.stop()
        peer.stop()


def _file_create_micros(root: Path, n: int = 200) -> float:
    """Median µs to make the two files each background command's start makes
    (``proc/ITEM.pid``, ``proc/ITEM.out``): how fast the scratch file system is."""
    samples = []
    for i in range(n):
        start = time.perf_counter()
        (root / f"probe{i}.pid").write_text("1\n")
        (root / f"probe{i}.out").write_bytes(b"")
        samples.append((time.perf_counter() - start) * 1e6)
    return round(statistics.median(samples), 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", action="append", help="run only this step (repeatable)")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path.home() / ".cache",
        help="where the servers' data directories go (default ~/.cache, where a user's data "
        "would be; how fast it makes a file is reported beside the results)",
    )
    args = parser.parse_args()
    quick = args.quick
    args.scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.scratch) as scratch:
        root = Path(scratch)
        results: dict[str, Any] = {
            "machine": {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "scratch": str(args.scratch),
                "scratchFileCreateMicros": _file_create_micros(root),
            },
            "at": now(),
        }
        steps = [
            ("store", lambda: bench_store(root / "store", 500 if quick else 5000, 3 if quick else 5)),
            ("latency", lambda: bench_latency(root / "latency", 10 if quick else 50)),
            ("fanout", lambda: bench_fanout(root / "fanout", 50 if quick else 1000)),
            ("stores", lambda: bench_stores(root / "stores", 50 if quick else 300)),
            (
                "restart",
                lambda: bench_restart_and_memory(root / "restart", [100] if quick else [100, 10_000]),
            ),
            ("mixed", lambda: bench_mixed(root / "mixed", 5.0 if quick else 20.0, 2 if quick else 10)),
        ]
        for name, step in steps:
            if args.only and name not in args.only:
                continue
            print(f"… {name}", file=sys.stderr, flush=True)
            results[name] = step()
            print(json.dumps(results[name], indent=1), file=sys.stderr, flush=True)
    RESULTS.mkdir(exist_ok=True)
    partial = "-" + "-".join(args.only) if args.only else ""
    target = RESULTS / (("quick" if quick else "latest") + partial + ".json")
    target.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    try:
        main()
    except httpx.HTTPError as error:
        sys.exit(f"benchmark failed: {error}")
