#!/usr/bin/env python3
"""A webhook delivery worker for ratebucket_queue, in Python with psycopg2.

    python3 worker.py                      # connects with the PG* environment
    python3 worker.py 'host=/var/run/postgresql dbname=app'     # or a libpq DSN

Each event's endpoint is the URL its payload is POSTed to, and the key of its
rate-limit bucket in ratebucket.  The worker loops (doc/claim.md):

  1. claim    claim_events(BATCH, PER_ENDPOINT): due events whose buckets
              have tokens, marked 'sending' under a lease of LEASE_SECONDS.
              One statement, so one short transaction of its own.
  2. deliver  POST each payload to its endpoint, all at once (a thread
              each), each with a timeout, outside any transaction.
  3. record   every answer of the batch with one record_deliveries call: the
              statuses, the Retry-After and rate-limit headers (ratebucket
              turns them into cooldowns and lower rates), whether each
              request left, the leases claimed and when each request left.
  4. sleep    when nothing was claimed: next_due() seconds (at most
              MAX_SLEEP), or until NOTIFY webhook_events says events arrived.

Every REQUEUE_EVERY seconds it also runs requeue_expired(), which puts back
the events of workers that died holding them.

SIGTERM or SIGINT: the batch in hand is delivered and recorded, then the
worker exits with status 0.  A database error ends it with a traceback
(status 1); the events it held come back when their leases run out.

The queue's functions are called unqualified: its schema must be on the
search_path (PGOPTIONS='-c search_path=outbox' if it is not public).
Delivery is at least once: destinations deduplicate on X-Event-Id.
Needs Python 3.8+ and psycopg2 (Debian: python3-psycopg2).
"""

import datetime
import http.client
import json
import os
import select
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Optional

import psycopg2

BATCH = 40            # most events per claim
PER_ENDPOINT = 10     # most events of one endpoint per claim
LEASE_SECONDS = 30    # the claim's lease: it must outlast a batch's requests
TIMEOUT = 10          # seconds: the connect, and each read of the answer
MIN_SLEEP = 0.01      # an idle worker sleeps at least this long ...
MAX_SLEEP = 5.0       # ... and at most this long between claims
REQUEUE_EVERY = 10.0  # seconds between requeue_expired() calls
CHANNEL = 'webhook_events'   # ratebucket_queue NOTIFYs it when events arrive

# The answer's fields ratebucket reads besides Retry-After (doc/feedback.md).
RATE_LIMIT_FIELDS = {'ratelimit', 'ratelimit-policy', 'ratelimit-limit',
                     'ratelimit-remaining', 'ratelimit-reset', 'x-ratelimit-limit',
                     'x-ratelimit-remaining', 'x-ratelimit-reset'}

CLAIM = """
SELECT id, endpoint, attempts, payload::text, lease_until
FROM claim_events(%s, %s, make_interval(secs => %s))
"""

RECORD = """
SELECT event_id, outcome
FROM record_deliveries(%(ids)s::bigint[], %(statuses)s::int[], %(leases)s::timestamptz[],
                       retry_afters => %(retry_afters)s::text[],
                       headers => %(headers)s::jsonb[],
                       sent => %(sent)s::boolean[],
                       sent_ats => %(sent_ats)s::timestamptz[])
"""


class Event(NamedTuple):
    """A claimed event, as claim_events returns it."""
    id: int
    endpoint: str                   # the URL to POST to
    attempts: int                   # requests sent for it before this one
    payload: str                    # JSON
    lease_until: datetime.datetime  # handed back to record_deliveries as it came


class Answer(NamedTuple):
    """What came of one request."""
    status: Optional[int]       # the HTTP status; None: no response
    retry_after: Optional[str]  # the Retry-After field, as received
    headers: Optional[dict]     # the rate-limit fields, as received
    sent: bool                  # False: the request never left (refused, unknown host)
    sent_at: float              # time.monotonic() when it was sent


# http and https only (an endpoint comes from a table: never file:// or
# ftp://), and no redirects: a 3xx is the destination's answer.
opener = urllib.request.OpenerDirector()
for handler in (urllib.request.HTTPHandler(), urllib.request.HTTPSHandler(),
                urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor()):
    opener.add_handler(handler)


def deliver(event):
    """POST the event's payload to its endpoint."""
    sent_at = time.monotonic()
    try:
        request = urllib.request.Request(
            event.endpoint, data=event.payload.encode(), method='POST',
            headers={'Content-Type': 'application/json',
                     'User-Agent': 'ratebucket-worker.py',
                     'X-Event-Id': str(event.id),           # for deduplication
                     'X-Attempt': str(event.attempts + 1)})
        with opener.open(request, timeout=TIMEOUT) as response:
            status, fields = response.status, response.headers
    except urllib.error.HTTPError as error:    # an answer: 3xx, 4xx, 5xx
        status, fields = error.code, error.headers
        error.close()
    except urllib.error.URLError as error:
        # Refused, or the host unknown: the request never left, and the
        # attempt does not count.  Anything else may have reached it.
        left = not isinstance(error.reason, (ConnectionRefusedError, socket.gaierror))
        return Answer(None, None, None, left, sent_at)
    except (OSError, http.client.HTTPException, ValueError):
        # A timeout, a reset, a garbled answer, an endpoint that is no URL:
        # no answer (a failure, retried after a backoff).
        return Answer(None, None, None, True, sent_at)
    headers = {}
    for name, value in fields.items():
        if name.lower() in RATE_LIMIT_FIELDS:
            headers[name] = headers[name] + ', ' + value if name in headers else value
    return Answer(status, fields.get('Retry-After'), headers or None, True, sent_at)


def record(cursor, batch, answers, claimed_at):
    """Record the whole batch's answers in one call; returns the outcomes."""
    def sent_at(event, answer):
        # When the request left, on the database's clock: the claim's
        # transaction began LEASE_SECONDS before the lease it returned ends.
        return event.lease_until - datetime.timedelta(
            seconds=LEASE_SECONDS - (answer.sent_at - claimed_at))

    cursor.execute(RECORD, {
        'ids': [e.id for e in batch],
        'statuses': [a.status for a in answers],
        'leases': [e.lease_until for e in batch],
        'retry_afters': [a.retry_after for a in answers],
        'headers': [json.dumps(a.headers) if a.headers else None for a in answers],
        'sent': [a.sent for a in answers],
        'sent_ats': [sent_at(e, a) for e, a in zip(batch, answers)],
    })
    return [outcome for _, outcome in cursor.fetchall()]


def main():
    dsn = sys.argv[1] if len(sys.argv) > 1 else ''
    conn = psycopg2.connect(dsn, fallback_application_name='ratebucket-worker.py')
    conn.autocommit = True      # every statement is a transaction of its own
    cursor = conn.cursor()
    cursor.execute('LISTEN ' + CHANNEL)

    # A signal asks for a stop: the batch in hand is finished first.  The
    # pipe wakes a sleeping worker.
    stop = []
    wake_r, wake_w = os.pipe()

    def on_signal(signum, frame):
        stop.append(signal.Signals(signum).name)
        os.write(wake_w, b'x')

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f'worker.py: delivering (backend pid {conn.get_backend_pid()})', file=sys.stderr)

    outcomes = {}
    next_requeue = time.monotonic()
    with ThreadPoolExecutor(BATCH) as pool:     # a batch's requests all at once
        while not stop:
            if time.monotonic() >= next_requeue:
                cursor.execute('SELECT requeue_expired()')
                next_requeue = time.monotonic() + REQUEUE_EVERY

            conn.notifies.clear()   # from now on, a NOTIFY is news
            claimed_at = time.monotonic()
            cursor.execute(CLAIM, (BATCH, PER_ENDPOINT, LEASE_SECONDS))
            batch = [Event(*row) for row in cursor.fetchall()]
            if batch:
                answers = list(pool.map(deliver, batch))
                for outcome in record(cursor, batch, answers, claimed_at):
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                continue

            # Nothing claimable: sleep until something could be (NULL:
            # nothing pending), or until events arrive, or a signal.
            cursor.execute('SELECT next_due()')
            due = cursor.fetchone()[0]
            timeout = MAX_SLEEP if due is None else min(max(due, MIN_SLEEP), MAX_SLEEP)
            if not conn.notifies:
                readable, _, _ = select.select([conn, wake_r], [], [], timeout)
                if conn in readable:
                    conn.poll()     # reads the notifications

    conn.close()
    summary = ', '.join(f'{n} {outcome}' for outcome, n in sorted(outcomes.items()))
    print(f'worker.py: stopped by {stop[0]}; recorded {summary or "nothing"}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
