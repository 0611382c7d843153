"""Schema versions of the PostgreSQL backend, kept in ``schema_version``. Each migration is
applied once, in order, in one transaction that holds the migration lock, so processes
starting together on one database migrate it once.

The shapes are SQLite's (records as JSON text in ``data`` beside the columns queries filter
on), with ``pos`` — a sequence — where SQLite lists by ``rowid``: an upsert keeps it, so
updating a record never moves it in creation order. Records stay JSON *text*, not
``jsonb``: ``jsonb`` reorders object keys, and records must read back exactly as written.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: the first schema (SQLite's migrations 1-5 in one).
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE threads (id TEXT PRIMARY KEY, pos BIGSERIAL, token_id TEXT, data TEXT NOT NULL);
    CREATE INDEX threads_token ON threads(token_id);
    CREATE INDEX threads_pos ON threads(pos);
    CREATE TABLE runs (id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, status TEXT NOT NULL,
                       seq BIGINT NOT NULL, data TEXT NOT NULL);
    CREATE INDEX runs_thread_status ON runs(thread_id, status, seq);
    CREATE INDEX runs_status ON runs(status);
    CREATE TABLE messages (id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, seq BIGINT NOT NULL,
                           run_id TEXT, data TEXT NOT NULL);
    CREATE INDEX messages_thread ON messages(thread_id, seq);
    CREATE INDEX messages_run ON messages(run_id);
    CREATE TABLE items (id TEXT PRIMARY KEY, pos BIGSERIAL, thread_id TEXT NOT NULL,
                        status TEXT NOT NULL, kind TEXT NOT NULL, task_id TEXT,
                        held BOOLEAN NOT NULL DEFAULT FALSE, data TEXT NOT NULL);
    CREATE INDEX items_thread ON items(thread_id, status);
    CREATE INDEX items_status ON items(status, kind);
    CREATE INDEX items_task ON items(task_id);
    CREATE INDEX items_held ON items(thread_id, held);
    CREATE TABLE tasks (id TEXT PRIMARY KEY, pos BIGSERIAL, parent_thread_id TEXT,
                        child_thread_id TEXT, status TEXT NOT NULL, follow_up_of TEXT,
                        parent_environment_id TEXT, remote_pending TEXT, data TEXT NOT NULL);
    CREATE INDEX tasks_parent ON tasks(parent_thread_id, status);
    CREATE INDEX tasks_child ON tasks(child_thread_id);
    CREATE INDEX tasks_status ON tasks(status);
    CREATE INDEX tasks_remote ON tasks(remote_pending);
    CREATE TABLE tokens (id TEXT PRIMARY KEY, pos BIGSERIAL, hash TEXT NOT NULL, kind TEXT NOT NULL,
                         thread_id TEXT, data TEXT NOT NULL);
    CREATE UNIQUE INDEX tokens_hash ON tokens(hash);
    CREATE TABLE links (environment_id TEXT PRIMARY KEY, pos BIGSERIAL, data TEXT NOT NULL);
    CREATE TABLE sends (id TEXT PRIMARY KEY, pos BIGSERIAL, environment_id TEXT NOT NULL,
                        status TEXT NOT NULL, data TEXT NOT NULL);
    CREATE INDEX sends_pending ON sends(environment_id, status);
    CREATE TABLE events (seq BIGSERIAL PRIMARY KEY, type TEXT NOT NULL, at TEXT NOT NULL,
                         thread_id TEXT, run_id TEXT, task_id TEXT, token_id TEXT,
                         data TEXT NOT NULL);
    CREATE INDEX events_token ON events(token_id, seq);
    CREATE INDEX events_at ON events(at);
    CREATE TABLE outbox (id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL,
                         thread_id TEXT, attempts INTEGER NOT NULL DEFAULT 0,
                         retry_at DOUBLE PRECISION NOT NULL DEFAULT 0,
                         parked BOOLEAN NOT NULL DEFAULT FALSE, last_error TEXT);
    CREATE INDEX outbox_due ON outbox(parked, retry_at);
    CREATE INDEX outbox_thread ON outbox(thread_id, parked);
    CREATE TABLE requests (scope TEXT NOT NULL, key TEXT NOT NULL, response TEXT NOT NULL,
                           PRIMARY KEY (scope, key));
    """,
    # 2: several processes on one database (SPEC §12): the processes and when each counts
    #    as gone; outbox rows claimed with a lease, and the process a row is for (stopping
    #    a turn or killing a process can only be done where it runs).
    """
    CREATE TABLE members (id TEXT PRIMARY KEY, until DOUBLE PRECISION NOT NULL);
    ALTER TABLE outbox ADD COLUMN member TEXT;
    ALTER TABLE outbox ADD COLUMN claimed_by TEXT;
    ALTER TABLE outbox ADD COLUMN claimed_until DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE INDEX outbox_member ON outbox(member);
    """,
    # 3: a task's label (its parent's name for it), found by the parent's tools.
    """
    ALTER TABLE tasks ADD COLUMN label TEXT;
    CREATE INDEX tasks_label ON tasks(parent_thread_id, label) WHERE label IS NOT NULL;
    """,
]
