//! `leasehold job enqueue --file jobs.jsonl`: many jobs from a file of JSON
//! lines, checked whole before anything is sent, then enqueued in batches
//! with a progress bar and a summary.
//!
//! One JSON object per line (blank lines are skipped); the fields are the
//! single enqueue's flags:
//!
//! | field | type | as the flag |
//! |---|---|---|
//! | `queue` | string | `--queue` (which is the default for lines without it) |
//! | `payload` | string, or any JSON value (sent as its compact JSON text) | `--payload` |
//! | `priority` | integer | `--priority` |
//! | `delay_ms` | integer | `--delay-ms` |
//! | `not_before_ms` | integer, Unix ms (not with `delay_ms`) | — |
//! | `max_attempts` | integer | `--max-attempts` |
//! | `lease_ttl_ms` | integer | `--lease-ttl-ms` |
//! | `idempotency_key` (or `key`) | string | `--key` |
//! | `tags` | list of strings | `--tag` |
//! | `backoff` | `{"base_ms": N, "cap_ms": N}` | — |
//!
//! Any other field is an error, so a misspelt one is never silently
//! dropped. Every line is checked against the limits every node enforces
//! before the first batch goes out: one bad line and nothing is sent.
//! Each batch is one atomic Enqueue call (so one id range, in file order);
//! a batch the cluster refuses is reported by its line numbers and the rest
//! go on.

use std::io::{BufRead, IsTerminal};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use leasehold_core::{Command, Limits, validate_command};
use leasehold_proto::v1;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::render::say;
use crate::{Output, render};

/// Most jobs in one Enqueue call by default: the limit every node enforces.
pub const DEFAULT_BATCH_JOBS: usize = 1_000;
/// A batch closes before its payloads pass this many bytes, well inside
/// the Queue service's request limit.
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Most bad lines listed before the rest are only counted.
const BAD_LINES_SHOWN: usize = 20;

/// One line of a jobs file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    queue: Option<String>,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    priority: i32,
    delay_ms: Option<u64>,
    not_before_ms: Option<u64>,
    max_attempts: Option<u32>,
    lease_ttl_ms: Option<u64>,
    #[serde(alias = "key")]
    idempotency_key: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    backoff: Option<LineBackoff>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineBackoff {
    base_ms: u64,
    cap_ms: u64,
}

/// A job read from the file, with the line it came from (1-based).
struct Numbered {
    line: usize,
    spec: v1::JobSpec,
}

/// Parses and checks one line: the job spec, or what is wrong with it,
/// naming the field.
fn parse_line(text: &str, default_queue: Option<&str>) -> Result<v1::JobSpec, String> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let line: Line = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = column_only(&error.into_inner());
        if path == "." || path.is_empty() { inner } else { format!("{path}: {inner}") }
    })?;
    deserializer.end().map_err(|error| format!("after the object: {}", column_only(&error)))?;
    let queue = match (line.queue, default_queue) {
        (Some(queue), _) => queue,
        (None, Some(queue)) => queue.to_string(),
        (None, None) => return Err("queue: missing (give it on the line or with --queue)".into()),
    };
    let payload = match line.payload {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => text.into_bytes(),
        Some(other) => other.to_string().into_bytes(),
    };
    let spec = v1::JobSpec {
        queue,
        payload,
        priority: line.priority,
        not_before_ms: line.not_before_ms,
        delay_ms: line.delay_ms,
        max_attempts: line.max_attempts,
        backoff: line.backoff.map(|b| v1::Backoff { base_ms: b.base_ms, cap_ms: b.cap_ms }),
        lease_ttl_ms: line.lease_ttl_ms,
        idempotency_key: line.idempotency_key,
        tags: line.tags,
    };
    // The checks every node makes, with the limits every node starts from,
    // so a line the cluster would refuse is caught before anything is sent.
    let core = leasehold_proto::convert::job_spec_from_wire(spec.clone(), 0, 0)
        .map_err(|error| strip_index(&error.to_string()))?;
    validate_command(&Command::Enqueue { jobs: vec![core] }, &Limits::default())
        .map_err(|error| strip_index(&error.to_string()))?;
    Ok(spec)
}

/// A JSON error with its position as a column: serde counts lines within
/// the text it was given, which is one line of the file here.
fn column_only(error: &serde_json::Error) -> String {
    let text = error.to_string();
    match text.split_once(" at line 1 column ") {
        Some((message, column)) => format!("{message} (column {column})"),
        None => text,
    }
}

/// `jobs[0].queue: …` → `queue: …`: on a line there is only one job.
fn strip_index(message: &str) -> String {
    message.strip_prefix("jobs[0].").unwrap_or(message).to_string()
}

/// Reads and checks the whole file: every job, or every bad line.
fn read_file(path: &Path, default_queue: Option<&str>) -> anyhow::Result<Vec<Numbered>> {
    let name = path.display().to_string();
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(path).with_context(|| format!("reading {name}"))?;
        Box::new(std::io::BufReader::new(file))
    };
    let mut jobs = Vec::new();
    let mut bad = Vec::new();
    for (index, text) in reader.lines().enumerate() {
        let line = index + 1;
        let text = text.with_context(|| format!("reading {name} line {line}"))?;
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(&text, default_queue) {
            Ok(spec) => jobs.push(Numbered { line, spec }),
            Err(problem) => bad.push(format!("{name} line {line}: {problem}")),
        }
    }
    if !bad.is_empty() {
        let mut message = bad.iter().take(BAD_LINES_SHOWN).cloned().collect::<Vec<_>>().join("\n");
        if bad.len() > BAD_LINES_SHOWN {
            message.push_str(&format!("\n… and {} more", bad.len() - BAD_LINES_SHOWN));
        }
        bail!("{message}\n{} bad line(s) in {name}; nothing was enqueued", bad.len());
    }
    if jobs.is_empty() {
        bail!("{name}: no jobs (one JSON object per line)");
    }
    Ok(jobs)
}

/// The jobs split into batches of at most `batch_jobs` jobs and about
/// [`BATCH_BYTES`] of payload each.
fn batches(jobs: Vec<Numbered>, batch_jobs: usize) -> Vec<Vec<Numbered>> {
    let mut batches = Vec::new();
    let mut current: Vec<Numbered> = Vec::new();
    let mut bytes = 0;
    for job in jobs {
        let size = job.spec.payload.len() + 256;
        if !current.is_empty() && (current.len() >= batch_jobs || bytes + size > BATCH_BYTES) {
            batches.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push(job);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// The line a server error points at (`jobs[12]…` in its message), else
/// the batch's line range.
fn failed_lines(batch: &[Numbered], message: &str) -> String {
    let pointed = message
        .split("jobs[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .and_then(|index| index.parse::<usize>().ok())
        .and_then(|index| batch.get(index));
    match (pointed, batch.first(), batch.last()) {
        (Some(job), _, _) => format!("line {} (its batch refused whole)", job.line),
        (None, Some(first), Some(last)) if first.line == last.line => {
            format!("line {}", first.line)
        }
        (None, Some(first), Some(last)) => format!("lines {}-{}", first.line, last.line),
        _ => "no lines".to_string(),
    }
}

/// A progress bar on stderr, hidden when stderr is not a terminal (a log
/// file or a pipe gets the summary alone).
fn progress(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {pos}/{len} jobs  {per_sec}  eta {eta}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Enqueues every job of `path`; exits 0 when every batch was enqueued.
pub async fn enqueue_file(
    client: &leasehold_client::Client,
    path: &Path,
    default_queue: Option<&str>,
    batch_jobs: usize,
    output: Output,
) -> anyhow::Result<std::process::ExitCode> {
    if !(1..=DEFAULT_BATCH_JOBS).contains(&batch_jobs) {
        bail!("--batch-size: must be 1 ..= {DEFAULT_BATCH_JOBS}, not {batch_jobs}");
    }
    let jobs = read_file(path, default_queue)?;
    let lines = jobs.len();
    let bar = progress(lines as u64);
    let (mut enqueued, mut duplicates, mut failed, mut unknown) = (0usize, 0usize, 0usize, 0usize);
    let mut failures = Vec::new();
    let all = batches(jobs, batch_jobs);
    let batch_count = all.len();
    // Set when no node answered: the batches from there on were not sent.
    let mut stopped: Option<(leasehold_client::ClientError, String, bool)> = None;
    let mut unsent: Vec<usize> = Vec::new();
    for batch in all {
        if stopped.is_some() {
            unsent.extend(batch.iter().map(|job| job.line));
            continue;
        }
        let specs = batch.iter().map(|job| job.spec.clone()).collect::<Vec<_>>();
        match client.enqueue(specs).await {
            Ok(results) => {
                duplicates += results.iter().filter(|r| r.duplicate).count();
                enqueued += results.iter().filter(|r| !r.duplicate).count();
            }
            Err(error) => {
                // A refused batch changed nothing; an unanswered one (the
                // node's UNAVAILABLE, a timeout, a broken connection) may
                // still have committed, and is counted apart rather than
                // guessed at.
                let maybe = crate::outcome_unknown(&error);
                if maybe {
                    unknown += batch.len();
                } else {
                    failed += batch.len();
                }
                let lines = failed_lines(&batch, &error.to_string());
                bar.suspend(|| render::write_stderr(&format!("error: {lines}: {error}\n")));
                failures.push(json!({"lines": lines, "error": error.to_string()}));
                if crate::no_node_answered(&error) {
                    // The rest is not sent; the summary still says what
                    // happened to every line, so the file can be resumed.
                    stopped = Some((error, lines, maybe));
                }
            }
        }
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    let unsent_lines = match (unsent.first(), unsent.last()) {
        (Some(first), Some(last)) => json!({"first": first, "last": last}),
        _ => Value::Null,
    };
    match output {
        Output::Json => render::print_json(&json!({
            "lines": lines,
            "batches": batch_count,
            "enqueued": enqueued,
            "duplicates": duplicates,
            "failed": failed,
            "unknown": unknown,
            "unsent": unsent.len(),
            "unsent_lines": unsent_lines,
            "failures": failures,
        })),
        Output::Text => say!(
            "{enqueued} enqueued, {duplicates} duplicates, {failed} failed, {unknown} unknown, \
             {} not sent ({lines} jobs in {batch_count} batches)",
            unsent.len()
        ),
    }
    if let Some((error, lines, maybe)) = stopped {
        let rest = match (unsent.first(), unsent.last()) {
            (Some(first), Some(last)) if first == last => format!("; line {first} was not sent"),
            (Some(first), Some(last)) => format!("; lines {first}-{last} were not sent"),
            _ => String::new(),
        };
        let one = !lines.starts_with("lines");
        let batch = match (maybe, one) {
            (true, _) => "may or may not have been enqueued",
            (false, true) => "was not enqueued",
            (false, false) => "were not enqueued",
        };
        return Err(anyhow::Error::new(error).context(format!(
            "{enqueued} enqueued and {duplicates} duplicates before the cluster stopped \
             answering: {lines} {batch}{rest}"
        )));
    }
    Ok(if failed + unknown == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_batch_is_unknown_and_a_refused_one_failed() {
        let status = |code| leasehold_client::ClientError::Status(tonic::Status::new(code, "x"));
        for code in
            [tonic::Code::Unavailable, tonic::Code::DeadlineExceeded, tonic::Code::Cancelled]
        {
            assert!(crate::outcome_unknown(&status(code)), "{code:?} may have committed");
        }
        for code in [tonic::Code::InvalidArgument, tonic::Code::PermissionDenied] {
            assert!(!crate::outcome_unknown(&status(code)), "{code:?} changed nothing");
        }
        let refused = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))));
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        let refused = leasehold_client::ClientError::Status(refused);
        assert!(!crate::outcome_unknown(&refused), "a refused connection sent nothing");
    }

    #[test]
    fn a_line_with_every_field_becomes_its_spec() {
        let spec = parse_line(
            r#"{"queue":"q","payload":{"a":1},"priority":-2,"delay_ms":5,"max_attempts":3,
               "lease_ttl_ms":2000,"key":"k","tags":["gpu"],"backoff":{"base_ms":1,"cap_ms":2}}"#,
            None,
        )
        .expect("a good line");
        assert_eq!(spec.queue, "q");
        assert_eq!(spec.payload, br#"{"a":1}"#);
        assert_eq!(spec.priority, -2);
        assert_eq!(spec.delay_ms, Some(5));
        assert_eq!(spec.max_attempts, Some(3));
        assert_eq!(spec.lease_ttl_ms, Some(2000));
        assert_eq!(spec.idempotency_key.as_deref(), Some("k"));
        assert_eq!(spec.tags, vec!["gpu".to_string()]);
        assert_eq!(spec.backoff, Some(v1::Backoff { base_ms: 1, cap_ms: 2 }));
    }

    #[test]
    fn the_default_queue_fills_a_line_without_one() {
        let spec = parse_line(r#"{"payload":"x"}"#, Some("emails")).expect("a good line");
        assert_eq!((spec.queue.as_str(), spec.payload.as_slice()), ("emails", &b"x"[..]));
        let error = parse_line(r#"{"payload":"x"}"#, None).expect_err("no queue");
        assert!(error.starts_with("queue:"), "{error}");
    }

    #[test]
    fn a_bad_line_names_its_field() {
        for (line, field) in [
            (r#"{"queue":"q","priority":"high"}"#, "priority:"),
            (r#"{"queue":"q","prioriy":1}"#, "prioriy"),
            (r#"{"queue":"Q!"}"#, "queue:"),
            (r#"{"queue":"q","lease_ttl_ms":1}"#, "lease_ttl_ms:"),
            (r#"{"queue":"q","max_attempts":0}"#, "max_attempts:"),
            (r#"{"queue":"q","delay_ms":1,"not_before_ms":1}"#, "delay_ms:"),
            (r#"{"queue":"q","tags":[""]}"#, "tags[0]:"),
            (r#"{"queue":"q","backoff":{"base_ms":0,"cap_ms":1}}"#, "backoff.base_ms:"),
            (r#"{"queue":"q"} {"queue":"r"}"#, "after the object"),
        ] {
            let error = parse_line(line, None).expect_err(line);
            assert!(error.contains(field), "{line}: {error} does not name {field}");
            assert!(!error.contains("at line 1"), "{line}: {error} names serde's own line");
        }
    }

    #[test]
    fn batches_keep_file_order_and_the_size_limits() {
        let jobs = (1..=2_500)
            .map(|line| Numbered { line, spec: v1::JobSpec::default() })
            .collect::<Vec<_>>();
        let split = batches(jobs, 1_000);
        assert_eq!(split.iter().map(Vec::len).collect::<Vec<_>>(), vec![1_000, 1_000, 500]);
        assert_eq!(split[1][0].line, 1_001);
        let big = (1..=3)
            .map(|line| Numbered {
                line,
                spec: v1::JobSpec { payload: vec![0; BATCH_BYTES / 2], ..Default::default() },
            })
            .collect::<Vec<_>>();
        assert_eq!(batches(big, 1_000).len(), 3);
    }

    #[test]
    fn a_refused_batch_names_the_line_the_server_pointed_at() {
        let batch =
            (7..=9).map(|line| Numbered { line, spec: v1::JobSpec::default() }).collect::<Vec<_>>();
        assert_eq!(
            failed_lines(&batch, "jobs[1].payload: too large"),
            "line 8 (its batch refused whole)"
        );
        assert_eq!(failed_lines(&batch, "no leader"), "lines 7-9");
    }
}
