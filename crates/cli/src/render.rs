//! How the CLI prints replies: JSON documents for `--output json` (stable
//! field names, times in Unix milliseconds), short lines otherwise.

use leasehold_proto::v1;
use serde_json::{Value, json};

/// A payload as text when it is UTF-8, else as hex, so JSON stays valid.
pub fn payload(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!({ "text": text }),
        Err(_) => json!({ "hex": bytes.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
    }
}

/// The lower-case name of a wire job state.
pub fn state_name(raw: i32) -> &'static str {
    match v1::JobState::try_from(raw) {
        Ok(v1::JobState::Ready) => "ready",
        Ok(v1::JobState::Claimed) => "claimed",
        Ok(v1::JobState::Acked) => "acked",
        Ok(v1::JobState::Dead) => "dead",
        _ => "unknown",
    }
}

/// A lease as JSON.
pub fn lease(lease: &v1::Lease) -> Value {
    json!({
        "job_id": lease.job_id,
        "holder": lease.holder,
        "token": lease.token,
        "epoch": lease.epoch,
        "granted_at_ms": lease.granted_at_ms,
        "expires_at_ms": lease.expires_at_ms,
    })
}

/// A job as JSON.
pub fn job(job: &v1::Job) -> Value {
    json!({
        "id": job.id,
        "queue": job.queue,
        "state": state_name(job.state),
        "payload": payload(&job.payload),
        "priority": job.priority,
        "not_before_ms": job.not_before_ms,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "lease_ttl_ms": job.lease_ttl_ms,
        "backoff": job.backoff.as_ref().map(|b| json!({"base_ms": b.base_ms, "cap_ms": b.cap_ms})),
        "idempotency_key": job.idempotency_key,
        "tags": job.tags,
        "last_error": job.last_error,
        "lease": job.lease.as_ref().map(lease),
        "enqueued_at_ms": job.enqueued_at_ms,
        "finished_at_ms": job.finished_at_ms,
        "result": (!job.result.is_empty()).then(|| payload(&job.result)),
    })
}

/// One line describing a job.
pub fn job_line(job: &v1::Job) -> String {
    let lease = job
        .lease
        .as_ref()
        .map(|l| {
            format!(" holder={} token={} expires_at_ms={}", l.holder, l.token, l.expires_at_ms)
        })
        .unwrap_or_default();
    format!(
        "job {} queue={} state={} attempts={}/{} priority={}{}",
        job.id,
        job.queue,
        state_name(job.state),
        job.attempts,
        job.max_attempts,
        job.priority,
        lease
    )
}

/// A grant as JSON.
pub fn grant(grant: &v1::Grant) -> Value {
    json!({
        "job": grant.job.as_ref().map(job),
        "lease": grant.lease.as_ref().map(lease),
    })
}

/// Stats as JSON.
pub fn stats(stats: &v1::StatsResponse) -> Value {
    json!({
        "cluster_time_ms": stats.cluster_time_ms,
        "last_token": stats.last_token,
        "last_job_id": stats.last_job_id,
        "queues": stats.queues.iter().map(|q| json!({
            "queue": q.queue,
            "ready": q.ready,
            "delayed": q.delayed,
            "claimed": q.claimed,
            "acked": q.acked,
            "dead": q.dead,
        })).collect::<Vec<_>>(),
    })
}

/// Cluster status as JSON.
pub fn status(status: &v1::StatusResponse) -> Value {
    json!({
        "leader": status.leader,
        "node_id": status.node_id,
        "nodes": status.nodes.iter().map(|n| json!({
            "id": n.id,
            "addr": n.addr,
            "role": n.role,
            "voter": n.voter,
            "term": n.term,
            "commit_index": n.commit_index,
            "applied_index": n.applied_index,
            "digest": format!("{:016x}", n.digest),
            "gate": n.gate.as_ref().map(|g| json!({
                "path": g.path,
                "reason": g.reason,
                "reason_label": g.reason_label,
                "intended": g.intended,
                "journal_lease": g.journal_lease,
                "dry_run": g.dry_run,
            })),
            "adverts": n.adverts.iter().map(|a| json!({
                "node_id": a.node_id,
                "version": a.version,
                "journal_lease": a.journal_lease,
                "dry_run": a.dry_run,
                "draining": a.draining,
                "role": a.role,
                "age_ms": a.age_ms,
                "online": a.online,
            })).collect::<Vec<_>>(),
            "adverts_rejected": n.adverts_rejected,
        })).collect::<Vec<_>>(),
    })
}

/// The gate part of one node's status, as text lines.
pub fn gate_lines(node: &v1::NodeStatus) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(gate) = &node.gate {
        lines.push(format!(
            "gate: path={} intended={} flags: journal_lease={} dry_run={} reason: {}",
            gate.path, gate.intended, gate.journal_lease, gate.dry_run, gate.reason
        ));
    }
    for advert in &node.adverts {
        let journal_lease = match advert.journal_lease {
            Some(on) => on.to_string(),
            None => "absent".to_string(),
        };
        lines.push(format!(
            "advert from node {}: version={} journal_lease={} dry_run={} draining={} role={} \
             age={}ms {}",
            advert.node_id,
            advert.version,
            journal_lease,
            advert.dry_run,
            advert.draining,
            advert.role,
            advert.age_ms,
            if advert.online { "online" } else { "offline" }
        ));
    }
    if node.adverts_rejected > 0 {
        lines.push(format!("adverts rejected: {}", node.adverts_rejected));
    }
    lines
}

/// Prints a JSON document on stdout.
pub fn print_json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()));
}
