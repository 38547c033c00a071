//! Where a commit round's time goes: each leasehold node times the stages
//! of the writes it serves (`leasehold_commit_stage_seconds{stage}`, a
//! histogram per stage). The driver scrapes every node's `/metrics` when
//! the measured window opens and when it closes; the difference of each
//! stage's `_sum` and `_count` over the window, summed over the nodes,
//! gives the stage's mean time and how often it ran.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The histogram family the nodes export.
const FAMILY: &str = "leasehold_commit_stage_seconds";

/// Most bytes read of one `/metrics` answer.
const MAX_SCRAPE_BYTES: u64 = 4 * 1024 * 1024;

/// One stage's totals on one scrape: seconds summed and times counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// `_sum`, seconds.
    pub seconds: f64,
    /// `_count`.
    pub count: u64,
}

/// Every stage's totals of one node at one moment, by stage name.
pub type Scrape = BTreeMap<String, Totals>;

/// One stage over a window, summed over the nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageMean {
    /// The stage's name, e.g. `replicate`.
    pub stage: String,
    /// How many times it ran in the window.
    pub count: u64,
    /// Its mean time, microseconds.
    pub mean_us: f64,
}

/// Reads the stage totals out of a `/metrics` text; lines of other
/// families are ignored, and a malformed value of this family is an error.
pub fn parse(text: &str) -> anyhow::Result<Scrape> {
    let mut scrape = Scrape::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(FAMILY) else { continue };
        let (kind, rest) = if let Some(rest) = rest.strip_prefix("_sum{") {
            ("sum", rest)
        } else if let Some(rest) = rest.strip_prefix("_count{") {
            ("count", rest)
        } else {
            continue;
        };
        let (labels, value) = rest.split_once("} ").with_context(|| format!("line {line:?}"))?;
        let stage = labels
            .split(',')
            .find_map(|label| label.strip_prefix("stage=\""))
            .and_then(|value| value.strip_suffix('"'))
            .with_context(|| format!("no stage label in {line:?}"))?;
        let value = value.split_whitespace().next().unwrap_or_default();
        let totals = scrape.entry(stage.to_string()).or_default();
        if kind == "sum" {
            totals.seconds = value.parse().with_context(|| format!("sum in {line:?}"))?;
        } else {
            // Counts print as integers, or as floats in some encoders.
            let count: f64 = value.parse().with_context(|| format!("count in {line:?}"))?;
            totals.count = count as u64;
        }
    }
    Ok(scrape)
}

/// Each stage's count and mean over a window, from the scrapes of every
/// node at its start and at its end (paired by position); stages that did
/// not run in the window are left out.
pub fn means(before: &[Scrape], after: &[Scrape]) -> Vec<StageMean> {
    let mut window: BTreeMap<&str, Totals> = BTreeMap::new();
    for (start, end) in before.iter().zip(after) {
        for (stage, last) in end {
            let first = start.get(stage).copied().unwrap_or_default();
            let totals = window.entry(stage.as_str()).or_default();
            totals.count += last.count.saturating_sub(first.count);
            totals.seconds += (last.seconds - first.seconds).max(0.0);
        }
    }
    window
        .into_iter()
        .filter(|(_, totals)| totals.count > 0)
        .map(|(stage, totals)| StageMean {
            stage: stage.to_string(),
            count: totals.count,
            mean_us: totals.seconds * 1e6 / totals.count as f64,
        })
        .collect()
}

/// Scrapes `http://ADDR/metrics` (plain HTTP/1.0 on a loopback address).
pub async fn scrape(addr: &str) -> anyhow::Result<Scrape> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(MAX_SCRAPE_BYTES).read_to_end(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("scraping {addr}: timed out"))?
        .with_context(|| format!("scraping {addr}"))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").context("an HTTP answer without a body")?;
    anyhow::ensure!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{addr}: {head}");
    parse(body)
}

/// Scrapes every address, in order.
pub async fn scrape_all(addrs: &[String]) -> anyhow::Result<Vec<Scrape>> {
    let mut scrapes = Vec::with_capacity(addrs.len());
    for addr in addrs {
        scrapes.push(scrape(addr).await?);
    }
    Ok(scrapes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(queue: (f64, u64), write: (f64, u64)) -> String {
        format!(
            "# TYPE leasehold_commit_stage_seconds histogram\n\
             leasehold_commit_stage_seconds_sum{{stage=\"queue\"}} {}\n\
             leasehold_commit_stage_seconds_count{{stage=\"queue\"}} {}\n\
             leasehold_commit_stage_seconds_bucket{{le=\"0.001\",stage=\"queue\"}} 1\n\
             leasehold_commit_stage_seconds_sum{{stage=\"write\"}} {}\n\
             leasehold_commit_stage_seconds_count{{stage=\"write\"}} {}\n\
             leasehold_rpc_duration_seconds_sum{{method=\"claim\"}} 9.5\n",
            queue.0, queue.1, write.0, write.1
        )
    }

    #[test]
    fn parses_sums_and_counts_of_each_stage_only() -> anyhow::Result<()> {
        let scrape = parse(&text((0.5, 10), (2.0, 4)))?;
        assert_eq!(scrape.len(), 2, "{scrape:?}");
        assert_eq!(scrape["queue"], Totals { seconds: 0.5, count: 10 });
        assert_eq!(scrape["write"], Totals { seconds: 2.0, count: 4 });
        assert!(parse("leasehold_commit_stage_seconds_sum{stage=\"queue\"} x\n").is_err());
        Ok(())
    }

    #[test]
    fn means_are_over_the_window_and_summed_over_nodes() -> anyhow::Result<()> {
        let before = vec![parse(&text((0.5, 10), (2.0, 4)))?, Scrape::new()];
        let after = vec![parse(&text((0.5, 10), (2.3, 7)))?, parse(&text((0.0, 0), (0.1, 1)))?];
        let means = means(&before, &after);
        // queue did not run in the window; write ran 3 + 1 times for 0.4 s.
        assert_eq!(means.len(), 1, "{means:?}");
        assert_eq!(means[0].stage, "write");
        assert_eq!(means[0].count, 4);
        assert!((means[0].mean_us - 100_000.0).abs() < 1e-6, "{means:?}");
        Ok(())
    }
}
