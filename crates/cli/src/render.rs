//! How the CLI prints replies: JSON documents for `--output json` (stable
//! field names, times in Unix milliseconds), aligned tables otherwise, the
//! way kubectl and nomad print: an upper-case header, one row per item,
//! columns padded with spaces, no borders. Every table is made here, so one
//! place decides how things print.

use comfy_table::{Cell, ContentArrangement, Table};
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
        "queue_count": stats.queue_count,
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

/// A node's digest, with the applied index it was taken at when that is not
/// the node's applied index (the node took it a moment before, under writes).
fn digest_cell(node: &v1::NodeStatus) -> String {
    if node.digest_index == node.applied_index {
        format!("{:016x}", node.digest)
    } else {
        format!("{:016x} @{}", node.digest, node.digest_index)
    }
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
            "digest_index": n.digest_index,
            "reachable": n.reachable,
            "ready": n.ready,
            "not_ready": n.not_ready,
            "clock_skewed": n.clock_skewed,
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

/// Prints a JSON document on stdout. The encoder escapes the C0 controls
/// but writes DEL and the C1 controls as they are; they can only stand in
/// strings, so they are written as `\u00XX` escapes too, and the document
/// stays exact and valid.
pub fn print_json(value: &Value) {
    write_stdout(&json_text(value));
}

/// The document [`print_json`] prints, with its final newline.
fn json_text(value: &Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let escaped = escape_controls(&text, |c| c.is_ascii_whitespace(), |c| format!("\\u{c:04x}"));
    format!("{escaped}\n")
}

/// Prints `text` on stdout, its control characters shown escaped
/// ([`terminal_safe`]).
pub fn print_text(text: &str) {
    write_stdout(&terminal_safe(text));
}

/// Prints a line on stdout as it is (the CLI's own words and ids), as
/// [`write_stdout`] does: never a panic on a reader gone away.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::render::write_stdout(&format!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use say;

/// Set once a write to stdout failed: later output is dropped.
static STDOUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set when that failure was not a reader gone away (a full disk, say).
static STDOUT_LOST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `text` on stdout. A reader that went away (`| head`) drops the
/// rest of the output quietly, and the command still ends with its own
/// exit code (bulk enqueue's failures stay 1), rather than a panic; any
/// other failure is reported on stderr, and [`stdout_lost`] turns a
/// success into a failure, since the output the user asked for is not
/// whole.
pub fn write_stdout(text: &str) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_FAILED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        STDOUT_FAILED.store(true, Ordering::Relaxed);
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            STDOUT_LOST.store(true, Ordering::Relaxed);
            write_stderr(&format!("error: writing the output: {error}\n"));
        }
    }
}

/// Writes `text` on stderr, ignoring a failure: with stderr gone too there
/// is nowhere left to say anything, and a panic would only cut the command
/// short (a bulk enqueue's remaining batches unsent).
pub fn write_stderr(text: &str) {
    use std::io::Write;
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes()).and_then(|()| stderr.flush());
}

/// Whether output was lost for a reason other than its reader going away.
pub fn stdout_lost() -> bool {
    STDOUT_LOST.load(std::sync::atomic::Ordering::Relaxed)
}

/// `text` with every control character but line feed and tab written as
/// `\u{..}`. What the CLI prints comes partly from producers and workers
/// (a job's tags, key, result and last error, a schedule's command), and a
/// terminal acts on the escape sequences in it: one could clear the
/// operator's screen, retitle the window or draw a fake prompt.
/// `--output json` gives the exact text, escaped ([`print_json`]).
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    escape_controls(text, |c| c == '\n' || c == '\t', |c| format!("\\u{{{c:x}}}"))
}

/// `text` with each control character but those `kept` accepts written as
/// `escape` writes its code point.
fn escape_controls(
    text: &str,
    kept: impl Fn(char) -> bool,
    escape: impl Fn(u32) -> String,
) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() && !kept(c);
    if !text.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            shown.push_str(&escape(u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// A borderless table with `header`: columns left-aligned and three
/// spaces apart, never wrapped (a pipe to `grep` or `awk` sees one row per
/// line whatever the terminal's width).
fn table(header: &[&str]) -> Rows {
    let mut table = Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| Cell::new(*h)));
    for column in table.column_iter_mut() {
        column.set_padding((0, 3));
    }
    Rows(table)
}

/// A table whose cells are made terminal-safe before it lays them out:
/// escaped afterwards, a cell holding an escape sequence would grow past
/// its column and push the rest of its row out of line. A tab is escaped
/// too (it would move the columns after it); a line feed stays, for a
/// cell of several lines.
struct Rows(Table);

impl Rows {
    fn add_row(&mut self, cells: Vec<String>) {
        self.0.add_row(cells.into_iter().map(|cell| {
            escape_controls(&cell, |c| c == '\n', |c| format!("\\u{{{c:x}}}")).into_owned()
        }));
    }
}

/// The table as text: no trailing spaces, no blank header separator, and a
/// final newline.
fn finish(rows: &Rows) -> String {
    let mut text = String::new();
    for line in rows.0.lines() {
        let line = line.trim_end();
        if !line.is_empty() {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

fn yes_no(on: bool) -> &'static str {
    if on { "yes" } else { "no" }
}

/// `cluster status` as text: the leader, then the members, then each
/// node's gate decision, then the adverts each node holds.
pub fn status_text(status: &v1::StatusResponse) -> String {
    let mut text =
        format!("Leader: node {} (answered by node {})\n\n", status.leader, status.node_id);
    let mut members = table(&[
        "ID",
        "ADDRESS",
        "ROLE",
        "VOTER",
        "TERM",
        "COMMIT",
        "APPLIED",
        "REACHABLE",
        "READY",
        "CLOCK",
        "GATE",
        "DIGEST",
    ]);
    for node in &status.nodes {
        members.add_row(vec![
            node.id.to_string(),
            node.addr.clone(),
            node.role.clone(),
            yes_no(node.voter).to_string(),
            node.term.to_string(),
            node.commit_index.to_string(),
            node.applied_index.to_string(),
            yes_no(node.reachable).to_string(),
            if node.reachable { yes_no(node.ready) } else { "-" }.to_string(),
            if node.clock_skewed { "skewed" } else { "ok" }.to_string(),
            node.gate.as_ref().map(|g| g.path.clone()).unwrap_or_else(|| "-".to_string()),
            digest_cell(node),
        ]);
    }
    text.push_str(&finish(&members));
    let gated: Vec<_> =
        status.nodes.iter().filter_map(|n| n.gate.as_ref().map(|g| (n.id, g))).collect();
    if !gated.is_empty() {
        let mut gates = table(&["NODE", "PATH", "INTENDED", "JOURNAL_LEASE", "DRY_RUN", "REASON"]);
        for (id, gate) in gated {
            gates.add_row(vec![
                id.to_string(),
                gate.path.clone(),
                gate.intended.clone(),
                yes_no(gate.journal_lease).to_string(),
                yes_no(gate.dry_run).to_string(),
                gate.reason.clone(),
            ]);
        }
        text.push_str("\nGate:\n");
        text.push_str(&finish(&gates));
    }
    let advertised = status.nodes.iter().any(|n| !n.adverts.is_empty() || n.adverts_rejected > 0);
    if advertised {
        let mut adverts = table(&[
            "NODE",
            "FROM",
            "VERSION",
            "JOURNAL_LEASE",
            "DRY_RUN",
            "DRAINING",
            "ROLE",
            "AGE_MS",
            "ONLINE",
            "REJECTED",
        ]);
        for node in &status.nodes {
            for advert in &node.adverts {
                adverts.add_row(vec![
                    node.id.to_string(),
                    advert.node_id.to_string(),
                    advert.version.to_string(),
                    advert.journal_lease.map(yes_no).unwrap_or("absent").to_string(),
                    yes_no(advert.dry_run).to_string(),
                    yes_no(advert.draining).to_string(),
                    advert.role.clone(),
                    advert.age_ms.to_string(),
                    yes_no(advert.online).to_string(),
                    node.adverts_rejected.to_string(),
                ]);
            }
            if node.adverts.is_empty() && node.adverts_rejected > 0 {
                adverts.add_row(vec![
                    node.id.to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    "-".to_string(),
                    node.adverts_rejected.to_string(),
                ]);
            }
        }
        text.push_str("\nAdverts held:\n");
        text.push_str(&finish(&adverts));
    }
    text
}

/// `job stats` as text: one row per queue.
pub fn stats_text(stats: &v1::StatsResponse) -> String {
    if stats.queues.is_empty() {
        return "no jobs\n".to_string();
    }
    let mut queues = table(&["QUEUE", "READY", "DELAYED", "CLAIMED", "ACKED", "DEAD"]);
    for q in &stats.queues {
        queues.add_row(vec![
            q.queue.clone(),
            q.ready.to_string(),
            q.delayed.to_string(),
            q.claimed.to_string(),
            q.acked.to_string(),
            q.dead.to_string(),
        ]);
    }
    let listed = u64::try_from(stats.queues.len()).unwrap_or(u64::MAX);
    let mut text = finish(&queues);
    if stats.queue_count > listed {
        text.push_str(&format!(
            "the {listed} queues holding the most jobs, of {}; name one with --queue\n",
            stats.queue_count
        ));
    }
    text
}

/// `job list` as text: one row per job, then how to get the next page.
pub fn jobs_text(jobs: &[v1::Job], next_page_token: &str) -> String {
    if jobs.is_empty() {
        return "no jobs\n".to_string();
    }
    let mut rows = table(&[
        "ID",
        "QUEUE",
        "STATE",
        "ATTEMPTS",
        "PRIORITY",
        "HOLDER",
        "TOKEN",
        "EXPIRES_AT_MS",
    ]);
    for job in jobs {
        let (holder, token, expires) = match &job.lease {
            Some(l) => (l.holder.clone(), l.token.to_string(), l.expires_at_ms.to_string()),
            None => ("-".to_string(), "-".to_string(), "-".to_string()),
        };
        rows.add_row(vec![
            job.id.to_string(),
            job.queue.clone(),
            state_name(job.state).to_string(),
            format!("{}/{}", job.attempts, job.max_attempts),
            job.priority.to_string(),
            holder,
            token,
            expires,
        ]);
    }
    let mut text = finish(&rows);
    if !next_page_token.is_empty() {
        text.push_str(&format!("more: --page-token {next_page_token}\n"));
    }
    text
}

/// `cron list` as text: one row per schedule.
pub fn schedules_text(schedules: &[v1::Schedule]) -> String {
    if schedules.is_empty() {
        return "no schedules\n".to_string();
    }
    let mut rows = table(&[
        "NAME",
        "CRON",
        "TIMEZONE",
        "PAUSED",
        "NEXT_TICK_MS",
        "LAST_FIRED",
        "FIRED",
        "SKIPPED",
    ]);
    for schedule in schedules {
        let spec = schedule.spec.clone().unwrap_or_default();
        rows.add_row(vec![
            spec.name,
            spec.cron,
            if spec.timezone.is_empty() { "UTC".to_string() } else { spec.timezone },
            yes_no(spec.paused).to_string(),
            schedule.next_tick_ms.map(|t| t.to_string()).unwrap_or_else(|| "-".to_string()),
            schedule.last_fired_bucket.to_string(),
            schedule.fired_count.to_string(),
            schedule.skipped_count.to_string(),
        ]);
    }
    finish(&rows)
}

/// `cron history` as text: one row per tick record, oldest first.
pub fn ticks_text(records: &[v1::TickRecord]) -> String {
    if records.is_empty() {
        return "no ticks yet\n".to_string();
    }
    let mut rows = table(&["BUCKET", "OUTCOME", "JOBS", "LAG_MS", "LATE", "REASON", "TICKS"]);
    for record in records {
        let jobs = record.job_ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        rows.add_row(vec![
            record.bucket.to_string(),
            record.outcome.clone(),
            if jobs.is_empty() { "-".to_string() } else { jobs },
            record.lag_ms.to_string(),
            yes_no(record.late).to_string(),
            if record.skip_reason.is_empty() {
                "-".to_string()
            } else {
                record.skip_reason.clone()
            },
            record.ticks.to_string(),
        ]);
    }
    finish(&rows)
}

/// A field/value table, for one item shown whole (`job get`, `cron get`).
pub fn fields_text(fields: &[(&str, String)]) -> String {
    let mut rows = table(&["FIELD", "VALUE"]);
    for (name, value) in fields {
        rows.add_row(vec![(*name).to_string(), value.clone()]);
    }
    finish(&rows)
}

/// `job get` as text.
pub fn job_text(job: &v1::Job) -> String {
    let lease = job.lease.as_ref();
    let mut fields = vec![
        ("id", job.id.to_string()),
        ("queue", job.queue.clone()),
        ("state", state_name(job.state).to_string()),
        ("attempts", format!("{}/{}", job.attempts, job.max_attempts)),
        ("priority", job.priority.to_string()),
        ("not_before_ms", job.not_before_ms.to_string()),
        ("lease_ttl_ms", job.lease_ttl_ms.to_string()),
        ("tags", if job.tags.is_empty() { "-".to_string() } else { job.tags.join(",") }),
        ("idempotency_key", job.idempotency_key.clone().unwrap_or_else(|| "-".to_string())),
        ("holder", lease.map(|l| l.holder.clone()).unwrap_or_else(|| "-".to_string())),
        ("token", lease.map(|l| l.token.to_string()).unwrap_or_else(|| "-".to_string())),
        (
            "expires_at_ms",
            lease.map(|l| l.expires_at_ms.to_string()).unwrap_or_else(|| "-".to_string()),
        ),
        ("enqueued_at_ms", job.enqueued_at_ms.to_string()),
    ];
    if let Some(finished) = job.finished_at_ms {
        fields.push(("finished_at_ms", finished.to_string()));
    }
    if let Some(error) = &job.last_error {
        fields.push(("last_error", error.clone()));
    }
    let mut text = fields_text(&fields);
    if !job.result.is_empty() {
        text.push_str(&format!("result:\n{}\n", String::from_utf8_lossy(&job.result).trim_end()));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_output_is_exact_valid_and_free_of_raw_controls() {
        let tag = "a\u{1b}[2J\u{7f}\u{9b}31m\u{7}z";
        let value = serde_json::json!({ "tags": [tag], "n": 1 });
        let text = json_text(&value);
        assert!(!text.chars().any(|c| c.is_control() && c != '\n' && c != ' '), "{text:?}");
        let read: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(read, value, "the document reads back exactly");
        let shown = terminal_safe(tag);
        assert_eq!(shown, "a\\u{1b}[2J\\u{7f}\\u{9b}31m\\u{7}z");
    }

    #[test]
    fn cells_are_escaped_before_the_columns_are_laid_out() {
        let mut rows = table(&["QUEUE", "READY"]);
        rows.add_row(vec!["a\u{1b}[2J\tb".to_string(), "1".to_string()]);
        rows.add_row(vec!["plain".to_string(), "2".to_string()]);
        let text = finish(&rows);
        let shown = terminal_safe(&text);
        assert_eq!(shown, text, "nothing left to escape once laid out: {text:?}");
        let starts: Vec<Option<usize>> = text
            .lines()
            .map(|line| {
                let last = line.split_whitespace().last()?;
                line.rfind(last)
            })
            .collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "columns out of line: {text}");
        assert!(text.contains("a\\u{1b}[2J\\u{9}b"), "{text}");
    }

    #[test]
    fn stats_say_when_they_list_only_the_largest_queues() {
        let queue =
            |name: &str| v1::QueueStats { queue: name.into(), ready: 1, ..Default::default() };
        let mut stats = v1::StatsResponse {
            queues: vec![queue("a"), queue("b")],
            queue_count: 2,
            ..Default::default()
        };
        assert!(!stats_text(&stats).contains("of 2"), "{}", stats_text(&stats));
        stats.queue_count = 1_500;
        let text = stats_text(&stats);
        assert!(text.contains("the 2 queues holding the most jobs, of 1500"), "{text}");
    }
}
