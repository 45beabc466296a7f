#!/usr/bin/env node
// A webhook delivery worker for ratebucket_queue, in Node.js with pg.
//
//   npm ci --omit=dev                 # once: installs pg (package-lock.json)
//   node worker.js                    # connects with the PG* environment
//   node worker.js postgresql://app@db.example/app     # or a connection URI
//
// Each event's endpoint is the URL its payload is POSTed to, and the key of
// its rate-limit bucket in ratebucket.  The worker loops (doc/claim.md):
//
//   1. claim    claim_events(BATCH, PER_ENDPOINT): due events whose buckets
//               have tokens, marked 'sending' under a lease of LEASE_SECONDS.
//               One statement, so one short transaction of its own.
//   2. deliver  POST each payload to its endpoint, all at once, each with a
//               timeout, outside any transaction.
//   3. record   every answer of the batch with one record_deliveries call:
//               the statuses, the Retry-After and rate-limit headers
//               (ratebucket turns them into cooldowns and lower rates),
//               whether each request left, the leases claimed and when each
//               request left.
//   4. sleep    when nothing was claimed: next_due() seconds (at most
//               MAX_SLEEP_MS), or until NOTIFY webhook_events says events
//               arrived.
//
// Every REQUEUE_EVERY_MS it also runs requeue_expired(), which puts back the
// events of workers that died holding them.
//
// SIGTERM or SIGINT: the batch in hand is delivered and recorded, then the
// worker exits with status 0.  A database error ends it (status 1); the
// events it held come back when their leases run out.
//
// The queue's functions are called unqualified: its schema must be on the
// search_path (PGOPTIONS='-c search_path=outbox' if it is not public).
// Delivery is at least once: destinations deduplicate on X-Event-Id.
// Needs Node.js 18 or later (fetch) and pg.

'use strict';

const { performance } = require('node:perf_hooks');
const { Client } = require('pg');

const BATCH = 40;               // most events per claim
const PER_ENDPOINT = 10;        // most events of one endpoint per claim
const LEASE_SECONDS = 30;       // the claim's lease: it must outlast a batch's requests
const TIMEOUT_MS = 10000;       // a whole request, answer included
const MIN_SLEEP_MS = 10;        // an idle worker sleeps at least this long ...
const MAX_SLEEP_MS = 5000;      // ... and at most this long between claims
const REQUEUE_EVERY_MS = 10000; // between requeue_expired() calls
const CHANNEL = 'webhook_events';   // ratebucket_queue NOTIFYs it when events arrive

// The answer's fields ratebucket reads besides Retry-After (doc/feedback.md).
const RATE_LIMIT_FIELDS = ['ratelimit', 'ratelimit-policy', 'ratelimit-limit',
  'ratelimit-remaining', 'ratelimit-reset', 'x-ratelimit-limit',
  'x-ratelimit-remaining', 'x-ratelimit-reset'];

// The lease as text, to hand it back exactly (a JavaScript Date keeps
// milliseconds only); and the moment the claim began (the lease's end less
// the lease), in milliseconds since the epoch, to tell when requests left.
const CLAIM = `
SELECT id, endpoint, attempts, payload::text AS payload, lease_until::text AS lease_until,
       (extract(epoch FROM lease_until) - $3::float8)::float8 * 1000 AS claimed_at_ms
FROM claim_events($1::int, $2::int, make_interval(secs => $3::float8))`;

const RECORD = `
SELECT event_id, outcome
FROM record_deliveries($1::bigint[], $2::int[], $3::timestamptz[],
                       retry_afters => $4::text[],
                       headers => $5::jsonb[],
                       sent => $6::boolean[],
                       sent_ats => $7::timestamptz[])`;

// Errors of a request that never left: the attempt does not count.
const NOT_SENT = ['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN'];

// POST the event's payload to its endpoint.  What came of it: the status
// (null: no response), the Retry-After and rate-limit fields as received,
// whether the request left, and when it was sent (performance.now()).
async function deliver(event) {
  const sentAt = performance.now();
  const answer = { status: null, retryAfter: null, headers: null, sent: true, sentAt };
  // http and https only: an endpoint comes from a table
  if (!/^https?:\/\//i.test(event.endpoint)) {
    return answer;              // no answer: a failure, retried after a backoff
  }
  try {
    const response = await fetch(event.endpoint, {
      method: 'POST',
      body: event.payload,
      headers: {
        'Content-Type': 'application/json',
        'User-Agent': 'ratebucket-worker.js',
        'X-Event-Id': event.id,                     // for deduplication
        'X-Attempt': String(event.attempts + 1),
      },
      redirect: 'manual',       // a 3xx is the destination's answer
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
    await response.arrayBuffer();   // the body, read and dropped
    answer.status = response.status;
    answer.retryAfter = response.headers.get('retry-after');
    for (const name of RATE_LIMIT_FIELDS) {
      const value = response.headers.get(name);
      if (value !== null) {
        answer.headers = { ...answer.headers, [name]: value };
      }
    }
  } catch (error) {
    // Refused, or the host unknown: it never left.  Anything else (a
    // timeout, a reset) may have reached the destination: no answer.
    answer.sent = !NOT_SENT.includes(error.cause?.code);
  }
  return answer;
}

// Record the whole batch's answers in one call; returns the outcomes.
async function record(client, batch, answers, claimedAt) {
  const { rows } = await client.query(RECORD, [
    batch.map((e) => e.id),
    answers.map((a) => a.status),
    batch.map((e) => e.lease_until),
    answers.map((a) => a.retryAfter),
    answers.map((a) => (a.headers ? JSON.stringify(a.headers) : null)),
    answers.map((a) => a.sent),
    // When each request left, on the database's clock: the claim began at
    // claimed_at_ms there, and the request left so long after it here.
    batch.map((e, i) => new Date(e.claimed_at_ms + answers[i].sentAt - claimedAt).toISOString()),
  ]);
  return rows.map((r) => r.outcome);
}

async function main() {
  const client = new Client({
    connectionString: process.argv[2],      // undefined: the PG* environment
    fallback_application_name: 'ratebucket-worker.js',
  });
  await client.connect();

  // A signal asks for a stop: the batch in hand is finished first.  A
  // NOTIFY, or a signal, ends a sleep early.
  let stop = null;
  let notified = false;
  let wake = () => {};
  const onSignal = (name) => { stop = stop || name; wake(); };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  client.on('notification', () => { notified = true; wake(); });
  client.on('error', (error) => {       // the connection was lost while idle
    console.error(`worker.js: ${error.message}`);
    process.exit(1);
  });
  const sleep = (ms) => new Promise((resolve) => {
    const timer = setTimeout(() => wake(), ms);
    wake = () => { clearTimeout(timer); wake = () => {}; resolve(); };
  });

  await client.query(`LISTEN ${CHANNEL}`);
  console.error(`worker.js: delivering (backend pid ${client.processID})`);

  const outcomes = {};
  let nextRequeue = performance.now();
  while (!stop) {
    if (performance.now() >= nextRequeue) {
      await client.query('SELECT requeue_expired()');
      nextRequeue = performance.now() + REQUEUE_EVERY_MS;
    }

    notified = false;           // from now on, a NOTIFY is news
    const claimedAt = performance.now();
    const { rows: batch } = await client.query(CLAIM, [BATCH, PER_ENDPOINT, LEASE_SECONDS]);
    if (batch.length > 0) {
      const answers = await Promise.all(batch.map(deliver));
      for (const outcome of await record(client, batch, answers, claimedAt)) {
        outcomes[outcome] = (outcomes[outcome] || 0) + 1;
      }
      continue;
    }

    // Nothing claimable: sleep until something could be (NULL: nothing
    // pending), or until events arrive, or a signal.
    const { rows: [{ due }] } = await client.query('SELECT next_due() AS due');
    const ms = due === null ? MAX_SLEEP_MS
      : Math.min(Math.max(due * 1000, MIN_SLEEP_MS), MAX_SLEEP_MS);
    if (!notified && !stop) {
      await sleep(ms);
    }
  }

  await client.end();
  const summary = Object.keys(outcomes).sort().map((o) => `${outcomes[o]} ${o}`).join(', ');
  console.error(`worker.js: stopped by ${stop}; recorded ${summary || 'nothing'}`);
  process.exit(0);
}

main().catch((error) => {
  console.error(`worker.js: ${error.stack || error}`);
  process.exit(1);
});
