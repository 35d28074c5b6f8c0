"""The SQLite store: sessions, turns (with exact token ids), the prefix index, judge/trainer hand-off, steps.

One file in WAL mode, created with mode 0600 (it holds conversations). All writes go through one connection guarded
by a lock, each in a single ``BEGIN IMMEDIATE`` transaction, so the store is safe to call from worker threads
(``asyncio.to_thread``) while the asyncio loops keep running. Readers use the same connection; WAL keeps other
processes (``openclaw export``) able to read while the server writes. A turn is two rows: ``turns`` (small, the
fields that change: status, next state, reward) and ``turn_data`` (the history, request/response JSON and token
arrays, written once); ``prefix_index`` maps canonical-history hashes to turns for session inference.

Durability: ``synchronous=NORMAL`` by default, so a committed transaction survives any crash of the process (the WAL
is written before commit returns) but the last transactions may be lost on power failure or an OS crash; pass
``synchronous="FULL"`` to make every commit reach the disk (several times slower on most disks).

Hand-off between loops is generic and at-least-once: :meth:`Store.claim_ready` leases ready main-line turns to a
named consumer in the order they became ready (an expired lease makes the turn claimable again) and
:meth:`Store.complete` records that consumer's result exactly once (a second completion is a no-op), so consumers
must be idempotent. Each turn gets a ``ready_seq`` when it becomes ready, and each consumer a floor below which
everything is done, so a claim only looks at the unfinished window however large the store grows.

Crash recovery: every claim names its owner (:attr:`Store.owner`, one per open store); at start-up a consumer calls
:meth:`Store.take_over_claims`, which takes the store's owner lock (released by the OS when a process dies, so
holding it proves the previous process is gone) and frees every claim another owner left, so nothing waits out a
lease after a ``kill -9``. :meth:`Store.release` gives a claim back early (with an error and a failure count, so a
consumer can give up on a turn and complete it with ``failed=True``). :meth:`Store.commit_step` writes a training
step's row and the completion of every turn it consumed in one transaction; :meth:`Store.discard_steps_after`
undoes steps whose weights never reached a checkpoint, reopening their turns (see ``openclaw_cli.learn.trainer_loop``).
"""

from openclaw_cli.secrets_scrub import scrub_secrets
from openclaw_cli.store.codec import pack_floats, pack_ints, unpack_floats, unpack_ints
from openclaw_cli.store.database import Store
from openclaw_cli.store.records import NewTurn, PrefixMatch, PurgeResult, SessionRecord, TurnRecord
from openclaw_cli.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, StoreError, SynchronousMode
from openclaw_cli.store.tx import StoreTx

__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "NewTurn",
    "PrefixMatch",
    "PurgeResult",
    "SessionRecord",
    "Store",
    "StoreError",
    "StoreTx",
    "SynchronousMode",
    "TurnRecord",
    "pack_floats",
    "pack_ints",
    "scrub_secrets",
    "unpack_floats",
    "unpack_ints",
]
