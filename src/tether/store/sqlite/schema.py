"""Schema versions. Each migration is applied once, in order, inside one transaction.

Records are kept as JSON in ``data`` beside the few columns queries filter on, so adding
a field to a record needs no migration; adding a filter column does.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: the first schema.
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE threads (id TEXT PRIMARY KEY, token_id TEXT, data TEXT NOT NULL);
    CREATE INDEX threads_token ON threads(token_id);
    CREATE TABLE runs (id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, status TEXT NOT NULL,
                       seq INTEGER NOT NULL, data TEXT NOT NULL);
    CREATE INDEX runs_thread_status ON runs(thread_id, status, seq);
    CREATE INDEX runs_status ON runs(status);
    CREATE TABLE messages (id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, seq INTEGER NOT NULL,
                           run_id TEXT, data TEXT NOT NULL);
    CREATE INDEX messages_thread ON messages(thread_id, seq);
    CREATE INDEX messages_run ON messages(run_id);
    CREATE TABLE items (id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, status TEXT NOT NULL,
                        kind TEXT NOT NULL, task_id TEXT, data TEXT NOT NULL);
    CREATE INDEX items_thread ON items(thread_id, status);
    CREATE INDEX items_status ON items(status, kind);
    CREATE INDEX items_task ON items(task_id);
    CREATE TABLE tasks (id TEXT PRIMARY KEY, parent_thread_id TEXT, child_thread_id TEXT,
                        status TEXT NOT NULL, follow_up_of TEXT, parent_environment_id TEXT,
                        data TEXT NOT NULL);
    CREATE INDEX tasks_parent ON tasks(parent_thread_id, status);
    CREATE INDEX tasks_child ON tasks(child_thread_id);
    CREATE INDEX tasks_status ON tasks(status);
    CREATE TABLE tokens (id TEXT PRIMARY KEY, hash TEXT NOT NULL, kind TEXT NOT NULL,
                         thread_id TEXT, data TEXT NOT NULL);
    CREATE UNIQUE INDEX tokens_hash ON tokens(hash);
    CREATE TABLE links (environment_id TEXT PRIMARY KEY, data TEXT NOT NULL);
    CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL,
                         at TEXT NOT NULL, thread_id TEXT, run_id TEXT, task_id TEXT,
                         token_id TEXT, data TEXT NOT NULL);
    CREATE INDEX events_token ON events(token_id, seq);
    CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
                         payload TEXT NOT NULL);
    CREATE TABLE requests (scope TEXT NOT NULL, key TEXT NOT NULL, response TEXT NOT NULL,
                           PRIMARY KEY (scope, key));
    """,
    # 2: remote tasks waiting for a call to their peer (create or cancel), found by a scan
    #    of this index when a link comes up.
    """
    ALTER TABLE tasks ADD COLUMN remote_pending TEXT;
    CREATE INDEX tasks_remote ON tasks(remote_pending);
    """,
    # 3: whether an item holds its thread, as a column: "is anything held?" becomes one
    #    indexed lookup instead of decoding every running item of a busy parent.
    """
    ALTER TABLE items ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    UPDATE items SET held = (status = 'running' AND (
        (kind = 'command' AND json_extract(data, '$.awaited'))
        OR (kind = 'monitor' AND NOT json_extract(data, '$.persistent'))
        OR (kind IN ('schedule', 'task') AND json_extract(data, '$.hold'))));
    CREATE INDEX items_held ON items(thread_id, held);
    """,
    # 4: messages for threads in linked environments, kept until the peer took them.
    """
    CREATE TABLE sends (id TEXT PRIMARY KEY, environment_id TEXT NOT NULL, status TEXT NOT NULL,
                        data TEXT NOT NULL);
    CREATE INDEX sends_pending ON sends(environment_id, status);
    """,
    # 5: side effects that failed are kept, retried with backoff, and parked (shown, never
    #    deleted) after repeated failures; each row names the thread it acts for.
    """
    ALTER TABLE outbox ADD COLUMN thread_id TEXT;
    ALTER TABLE outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN retry_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN last_error TEXT;
    CREATE INDEX outbox_due ON outbox(parked, retry_at);
    CREATE INDEX outbox_thread ON outbox(thread_id, parked);
    """,
    # 6: a task's label (its parent's name for it), found by the parent's tools.
    """
    ALTER TABLE tasks ADD COLUMN label TEXT;
    CREATE INDEX tasks_label ON tasks(parent_thread_id, label) WHERE label IS NOT NULL;
    """,
]
