#!/bin/sh
# A shardcron job that writes its result to SQLite behind the fence.
#
#   report.sh DATABASE [BODY]
#
# The row for (CRON_JOB, CRON_SCHEDULED_AT) is inserted, or replaced only when this run's
# CRON_FENCE is larger than the fence already stored: a leader that lost its shard while this
# command was running cannot overwrite what the newer leader wrote. Every attempt is also logged
# in `attempts`, with whether the store accepted it.
set -eu

db=${1:?usage: report.sh DATABASE [BODY]}
body=${2:-"report of $CRON_JOB for $CRON_SCHEDULED_AT"}
here=$(dirname "$0")
started_at=$(date +%s.%N)

case "$CRON_FENCE" in
    '' | *[!0-9]*) echo "CRON_FENCE is not a number: '$CRON_FENCE'" >&2; exit 2 ;;
esac
case "$CRON_SHARD" in
    '' | *[!0-9]*) echo "CRON_SHARD is not a number: '$CRON_SHARD'" >&2; exit 2 ;;
esac

# SQL string literal: wrap in quotes, double any quote inside.
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/''/g")"; }

job=$(quote "$CRON_JOB")
tick=$(quote "$CRON_SCHEDULED_AT")
node=$(quote "$CRON_NODE")
body=$(quote "$body")

# One transaction: the fenced upsert, then the audit row, which reads back whether the stored
# row now carries this run's fence and node. busy_timeout waits out other nodes' writes.
sqlite3 -bail "$db" <<SQL
.timeout 10000
.read $here/schema.sql
BEGIN IMMEDIATE;
INSERT INTO reports (job, tick, fence, node, body)
VALUES ($job, $tick, $CRON_FENCE, $node, $body)
ON CONFLICT (job, tick) DO UPDATE
    SET fence = excluded.fence, node = excluded.node, body = excluded.body
    WHERE excluded.fence > reports.fence;
INSERT INTO attempts (job, tick, fence, node, shard, started_at, accepted)
SELECT $job, $tick, $CRON_FENCE, $node, $CRON_SHARD, $started_at,
       EXISTS (SELECT 1 FROM reports
               WHERE job = $job AND tick = $tick AND fence = $CRON_FENCE AND node = $node);
COMMIT;
SQL
