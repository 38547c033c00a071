//! The status JSON, laid out for the page from the three service answers.
//! Nothing here computes scheduler facts: it picks fields and names them,
//! and the one thing it joins is each member's advert age, which the
//! answering node holds (its adverts from its peers).

use leasehold_proto::v1;
use serde_json::{Value, json};

/// How many of a schedule's newest skipped records the page lists.
const SKIPS_SHOWN: usize = 5;

/// The page's JSON from `Cluster.Status`, `Queue.Stats` and `Schedules.List`.
pub(super) fn render(
    cluster: &v1::StatusResponse,
    stats: &v1::StatsResponse,
    schedules: &v1::ListSchedulesResponse,
) -> Value {
    let answering = cluster.nodes.iter().find(|node| node.id == cluster.node_id);
    let advert_age = |id: u64| -> Value {
        answering
            .and_then(|me| me.adverts.iter().find(|advert| advert.node_id == id))
            .map_or(Value::Null, |advert| json!(advert.age_ms))
    };
    let nodes: Vec<Value> = cluster
        .nodes
        .iter()
        .map(|node| {
            let gate = node.gate.as_ref();
            json!({
                "id": node.id,
                "addr": node.addr,
                "role": node.role,
                "term": node.term,
                "applied_index": node.applied_index,
                "commit_index": node.commit_index,
                "voter": node.voter,
                "reachable": node.reachable,
                "ready": node.ready,
                "not_ready": node.not_ready,
                "advert_age_ms": if node.id == cluster.node_id { Value::Null } else { advert_age(node.id) },
                "gate": gate.map_or(Value::Null, |gate| json!({
                    "path": gate.path,
                    "reason": gate.reason,
                    "intended": gate.intended,
                })),
                "clock": node.clock,
            })
        })
        .collect();
    let oldest_ready: std::collections::HashMap<&str, u64> =
        stats.oldest_ready.iter().map(|oldest| (oldest.queue.as_str(), oldest.age_ms)).collect();
    let oldest = |queue: &str| oldest_ready.get(queue).map_or(Value::Null, |age| json!(age));
    let queues: Vec<Value> = stats
        .queues
        .iter()
        .map(|queue| {
            json!({
                "queue": queue.queue,
                "ready": queue.ready,
                "delayed": queue.delayed,
                "claimed": queue.claimed,
                "acked": queue.acked,
                "dead": queue.dead,
                "oldest_ready_age_ms": oldest(&queue.queue),
            })
        })
        .collect();
    let schedules: Vec<Value> = schedules.schedules.iter().map(schedule).collect();
    json!({
        "node_id": cluster.node_id,
        "leader": if cluster.leader == 0 { Value::Null } else { json!(cluster.leader) },
        "cluster_time_ms": stats.cluster_time_ms,
        "nodes": nodes,
        "queues": queues,
        "queue_count": stats.queue_count,
        "schedules": schedules,
        "recent_expiries": stats.recent_expiries.iter().map(|expired| json!({
            "job_id": expired.job_id,
            "queue": expired.queue,
            "attempts": expired.attempts,
            "state": expired.state,
            "expired_at_ms": if expired.expired_at_ms == 0 { Value::Null } else { json!(expired.expired_at_ms) },
        })).collect::<Vec<_>>(),
        "recent_redeliveries": stats.recent_redeliveries.iter().map(|again| json!({
            "job_id": again.job_id,
            "queue": again.queue,
            "delivery": again.delivery,
            "holder": again.holder,
            "granted_at_ms": again.granted_at_ms,
            "last_error": again.last_error,
        })).collect::<Vec<_>>(),
    })
}

/// One schedule: its next tick, its last fire, its newest skips with their
/// reasons, and the ticks it had against those it fired or skipped.
fn schedule(schedule: &v1::Schedule) -> Value {
    let spec = schedule.spec.clone().unwrap_or_default();
    let last_fired = schedule.history.iter().rev().find(|record| record.outcome == "fired");
    let skips: Vec<Value> = schedule
        .history
        .iter()
        .rev()
        .filter(|record| record.outcome == "skipped")
        .take(SKIPS_SHOWN)
        .map(|record| {
            json!({
                "bucket_ms": record.bucket.saturating_mul(1_000),
                "reason": record.skip_reason,
                "ticks": record.ticks,
            })
        })
        .collect();
    json!({
        "name": spec.name,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "paused": spec.paused,
        "next_tick_ms": schedule.next_tick_ms,
        "last_fired_ms": last_fired.map(|record| record.bucket.saturating_mul(1_000)),
        "last_fired_lag_ms": last_fired.map(|record| record.lag_ms),
        "last_fired_bucket": schedule.last_fired_bucket,
        "fired": schedule.fired_count,
        "skipped": schedule.skipped_count,
        "expected": schedule.expected_ticks,
        "skips": skips,
    })
}
